"""Memory planning: reuse buffers through in-place and out= variants; free big values early.

`plan_memory` walks the body once. For a call whose result has a static meta:

1. In place: if an operand's storage is the program's own (not an input, constant or setup
   value), dies at this call and has exactly the result's meta, the call becomes the in-place
   variant writing that operand (`relu_(buf3)`), and the result is that operand. Commutative ops
   may swap operands to do so.
2. Out variant: else, if the result does not escape to the caller, the call writes into a
   persistent buffer with `out=`. Buffers are views (set up once) of slots allocated at bind
   time; a slot whose values are all dead is reused by later results of the same dtype/device.
   CPU values only: a CUDA buffer shared by calls on two streams would be written by one call
   while the other's kernels still read it, and CUDA's caching allocator already reuses memory
   in stream order for a fraction of a kernel launch.

Symbolic sizes (dynamic shapes): in-place reuse needs the operand's meta to equal the result's,
which for size expressions means the same canonical expression, so it is provably the same size
for every call. A contiguous result with symbolic sizes gets a slot when its size has an upper
bound in the program's ranges (the input check enforces them): the slot holds the largest size,
and each call views it with that call's sizes (a View in the body, after the sizes are bound).
Results without a bound are allocated per call by the functional kernel. The plan's counts go
into the program's notes, and from there into `report()`.

Graph outputs never land in a slot, so every returned tensor is fresh. Persistent buffers make the
compiled function non-reentrant; the executor guards that with a lock. `insert_frees` then adds
`del` after the last use of each per-call value of at least FREE_BYTES.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from opgen.runtime.ir import (
    ITEMSIZE,
    Alloc,
    Arg,
    Free,
    KernelCall,
    Line,
    Program,
    Ref,
    SizeLet,
    TensorMeta,
    Value,
    View,
    defs,
    meta_table,
    refs,
    substitute_line,
)
from opgen.runtime.passes.analysis import (
    Groups,
    alias_groups,
    escaping,
    fresh_namer,
    info_of,
    last_uses,
    setup_names,
)
from opgen.runtime.registry import KernelRegistry, OpInfo
from opgen.runtime.sizes import product, upper_bound

COMMUTATIVE = frozenset({"aten::add.Tensor", "aten::mul.Tensor", "aten::maximum", "aten::minimum"})
FREE_BYTES = 64 * 1024


@dataclass
class _Slot:
    name: str
    dtype: str
    device: str
    numel: int


@dataclass
class _Planner:
    program: Program
    registry: KernelRegistry
    metas: dict[str, TensorMeta] = field(init=False)
    escapes: set[str] = field(init=False)
    groups: Groups = field(init=False)
    last: dict[str, int] = field(init=False)
    foreign: set[str] = field(init=False)
    persistent: dict[str, _Slot] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    free: list[_Slot] = field(default_factory=list)
    slots: list[_Slot] = field(default_factory=list)
    views: list[Line] = field(default_factory=list)
    mapping: dict[str, Arg] = field(default_factory=dict)
    per_call_views: list[Line] = field(default_factory=list)  # views of slots with symbolic sizes
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("in_place", "bounded", "per_call"), 0))

    def __post_init__(self) -> None:
        p = self.program
        self.metas = meta_table(p)
        self.escapes = escaping(p, self.registry)
        self.groups = alias_groups((*p.memo, *p.body), self.registry)
        self.last = last_uses(p.body)
        fallback_outputs = {
            v.name
            for line in p.body
            if isinstance(line, KernelCall) and line.fallback and not line.fresh
            for v in defs(line)
        }
        memo = {v.name for line in p.memo for v in defs(line)}  # kept between calls by the size memo
        self.foreign = setup_names(p) | memo | {i.name for i in p.inputs} | fallback_outputs
        self.slot_names = fresh_namer(p, "slot")

    def group_last(self, name: str) -> int:
        return max(self.last.get(m, -1) for m in self.groups.members(name))

    def owned(self, name: str) -> bool:
        return not any(m in self.foreign for m in self.groups.members(name))

    def read_elsewhere(self, line: KernelCall, pos: int, name: str) -> bool:
        """Whether another argument reads the operand's storage (a view of it would see partial writes)."""
        group = set(self.groups.members(name))
        others = [*line.args[:pos], *line.args[pos + 1 :], *(v for _, v in line.kwargs)]
        return any(r in group and not (r == name and line.pointwise) for r in refs(tuple(others)))

    def release_dead(self, i: int) -> None:
        for root, slot in self.persistent.items():
            if root not in self.released and self.group_last(root) < i:
                self.released.add(root)
                self.free.append(slot)

    def take_slot(self, meta: TensorMeta, span: int) -> _Slot:
        same = [s for s in self.free if s.dtype == meta.dtype and s.device == meta.device]
        fits = [s for s in same if s.numel >= span]
        slot = min(fits, key=lambda s: s.numel) if fits else max(same, key=lambda s: s.numel, default=None)
        if slot is None:
            slot = _Slot(next(self.slot_names), meta.dtype, meta.device, span)
            self.slots.append(slot)
        else:
            self.free.remove(slot)
            slot.numel = max(slot.numel, span)
        return slot

    def in_place(self, i: int, line: KernelCall, info: OpInfo) -> KernelCall | None:
        inplace = self.registry.sibling(info, "inplace")
        out = line.outputs[0] if len(line.outputs) == 1 and not line.unpack else None
        if (
            inplace is None
            or out is None
            or out.meta is None
            or [a.name for a in inplace.args] != [a.name for a in info.args]
        ):
            return None
        swap_ok = info.aten in COMMUTATIVE and dict(line.kwargs).get("alpha", 1) == 1 and len(line.args) >= 2
        for pos in (0, 1) if swap_ok else (0,):
            operand = line.args[pos] if pos < len(line.args) else None
            if not isinstance(operand, Ref) or self.metas.get(operand.name) != out.meta:
                continue
            name = operand.name
            if not self.owned(name) or self.group_last(name) != i or self.read_elsewhere(line, pos, name):
                continue
            if out.name in self.escapes and self.groups.find(name) in self.persistent:
                continue
            args = line.args if pos == 0 else (line.args[1], line.args[0], *line.args[2:])
            root = self.groups.find(name)
            self.groups.union(root, out.name)
            self.mapping[out.name] = self.mapping.get(name, operand)
            return KernelCall(
                inplace.name, args, line.kwargs, (), line.node, line.target, mutates=(name,), pointwise=line.pointwise
            )
        return None

    def out_variant(self, line: KernelCall, info: OpInfo) -> KernelCall | None:
        out = line.outputs[0] if len(line.outputs) == 1 and not line.unpack else None
        meta = out.meta if out is not None else None
        if out is None or meta is None or out.name in self.escapes or meta.dtype not in ITEMSIZE:
            return None
        if meta.device != "cpu":
            return None
        span = self.slot_span(meta)
        if span is None:
            return None
        if info.name == "clone" and "copy_" in self.registry.by_name:
            call = KernelCall(
                "copy_", (Ref(out.name), line.args[0]), (), (), line.node, line.target, mutates=(out.name,)
            )
        else:
            variant = self.registry.sibling(info, "out")
            if variant is None or [a.name for a in variant.args] != [a.name for a in info.args] + ["out"]:
                return None
            kwargs = (*line.kwargs, ("out", Ref(out.name)))
            call = KernelCall(
                variant.name,
                line.args,
                kwargs,
                (),
                line.node,
                line.target,
                mutates=(out.name,),
                pointwise=line.pointwise,
            )
        slot = self.take_slot(meta, span)
        self.persistent[self.groups.find(out.name)] = slot
        view = View(Value(out.name, meta), slot.name, line.node)
        (self.views if meta.is_static else self.per_call_views).append(view)
        return call

    def slot_span(self, meta: TensorMeta) -> int | None:
        """Elements a slot needs for this result (the upper bound for symbolic sizes), or None: no slot."""
        if meta.is_static:
            return meta.span if meta.offset == 0 and meta.span == meta.numel and meta.numel else None
        bound = upper_bound(product(meta.shape), self.program.ranges) if meta.is_contiguous() else None
        self.counts["bounded" if bound else "per_call"] += 1
        return bound

    def run(self) -> Program:
        body: list[Line] = []
        for i, line in enumerate(self.program.body):
            self.release_dead(i)
            planned = None
            info = info_of(line, self.registry) if isinstance(line, KernelCall) else None
            if isinstance(line, KernelCall) and info is not None and info.variant == "functional" and not info.is_view:
                planned = self.in_place(i, line, info)
                self.counts["in_place"] += planned is not None and bool(line.outputs[0].meta.symbols)  # type: ignore[union-attr]
                planned = planned or self.out_variant(line, info)
            body += self.per_call_views
            self.per_call_views.clear()
            body.append(substitute_line(planned or line, self.mapping))
        allocs = [Alloc(Value(s.name, TensorMeta((s.numel,), (1,), s.dtype, s.device))) for s in self.slots]
        setup = (*self.program.setup, *allocs, *self.views)
        return replace(self.program, setup=setup, body=tuple(body), notes=(*self.program.notes, *self.notes()))

    def notes(self) -> tuple[str, ...]:
        """What the plan did with results of symbolic sizes."""
        c = self.counts
        if not any(c.values()):
            return ()
        return (
            f"memory plan, symbolic sizes: {c['in_place']} results in place (provably equal sizes), {c['bounded']} "
            f"in reused buffers sized for the ranges' upper bounds, {c['per_call']} allocated per call (no bound)",
        )


def plan_memory(program: Program, registry: KernelRegistry) -> Program:
    return _Planner(program, registry).run()


def _big(meta: TensorMeta | None) -> bool:
    return meta is None or not meta.is_static or meta.numel * ITEMSIZE.get(meta.dtype, 8) >= FREE_BYTES


def insert_frees(program: Program, registry: KernelRegistry) -> Program:
    """`del` each big per-call value after its last use, so peak memory follows liveness."""
    lines = program.body
    last = last_uses(lines)
    resident = setup_names(program)
    frees: dict[int, list[str]] = {}
    for i, line in enumerate(lines):
        held = isinstance(line, SizeLet) or (isinstance(line, View) and line.source in resident)  # a slot's view
        for value in defs(line) if not held else ():
            if value.name not in resident and _big(value.meta):
                frees.setdefault(last.get(value.name, i), []).append(value.name)
    body: list[Line] = []
    for i, line in enumerate(lines):
        body.append(line)
        names = [n for n in frees.get(i, ()) if i + 1 < len(lines)]
        if names and not isinstance(line, Free):
            body.append(Free(tuple(names)))
    return replace(program, body=tuple(body))
