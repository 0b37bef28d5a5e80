"""Which nodes of a program fuse: maximal groups of pointwise nodes, and row reductions joining them.

One walk over the body, in order. A fusible node (`opgen.runtime.passes.fusion.ops`: a functional CUDA
call with static sizes) joins the open group that defines one of its operands when the shapes fit,
else it starts a group. A group runs where its last member was, so it closes (takes no more
members) when anything outside it reads one of its values, and every group closes at a call that
writes memory (in-place and out= calls, ATen fallbacks, Triton kernels): moving a read across a
write could change what it reads. Nothing is fused across such a call, a matmul or a convolution,
since those are never members.

Shapes: a pointwise group iterates over one shape `S` (its members' output shape; operands
broadcast to it). A row group also holds reductions over the last dimension of `S`: its values
are full (`S`) or reduced (`S[:-1] + (1,)`, broadcast back along the row); a reduction without
keepdim is an output only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, Return, TensorMeta, meta_table, refs, uses
from opgen.runtime.passes.analysis import readers, writes_memory
from opgen.runtime.passes.fusion.ops import CAT, DTYPES, POINTWISE, ROW_OPS
from opgen.runtime.registry import BindError, KernelRegistry, bind

MAX_ROW = 8192  # longest row a row kernel holds in registers (float32)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor a fused kernel reads or writes; `name` is its IR value and the kernel's parameter."""

    name: str
    meta: TensorMeta


@dataclass(frozen=True, slots=True)
class Step:
    """One graph node inside a fused kernel."""

    node: str
    target: str  # "aten.mul.Tensor"
    values: tuple[tuple[str, Arg], ...]  # its arguments by schema name; tensors as `Ref`s
    outputs: tuple[Tensor | None, ...]  # the values it defines (None: unused)
    # A cat: per operand, the absorbed steps that compute it in its range (none: the operand is loaded).
    branches: tuple[tuple[Step, ...], ...] = ()


def flat_steps(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """Every step, those inside a cat's branches first (they ran earlier), each once."""
    seen: dict[str, Step] = {}
    for step in steps:
        for branch in step.branches:
            for inner in flat_steps(branch):
                seen.setdefault(inner.node, inner)
        seen.setdefault(step.node, step)
    return tuple(seen.values())


@dataclass(frozen=True, slots=True)
class FusedGroup:
    kind: str  # "pointwise" | "row"
    shape: tuple[int, ...]  # the iteration space S
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]  # the values read after the kernel, in definition order
    steps: tuple[Step, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in flat_steps(self.steps))

    def describe(self) -> str:
        dims = "x".join(map(str, self.shape))
        if self.kind == "row":
            rows = 1
            for n in self.shape[:-1]:
                rows *= n
            return f"row kernel, {rows} rows of {self.shape[-1]} ({dims})"
        return f"pointwise kernel over {dims}"


@dataclass(frozen=True, slots=True)
class Found:
    """A group and where it was: the body indices of its members (it runs at the last)."""

    group: FusedGroup
    members: tuple[int, ...]
    lines: tuple[KernelCall, ...]


def find_groups(program: Program, registry: KernelRegistry) -> list[Found]:
    metas = meta_table(program)
    read_later = readers(program.body)
    walk = _Walk(metas, read_later)
    for index, line in enumerate(program.body):
        step = _step(line, registry, metas) if isinstance(line, KernelCall) else None
        if step is None:
            walk.outside(line)
        else:
            assert isinstance(line, KernelCall)
            walk.add(index, line, step)
    walk.close_all()
    return [found for b in walk.done if (found := b.finish(read_later)) is not None]


@dataclass
class _Building:
    kind: str
    shape: tuple[int, ...]
    device: str
    members: list[int] = field(default_factory=list)
    lines: list[KernelCall] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    step_at: list[int] = field(default_factory=list)  # each step's body index (a cat's absorbed members have none)
    defined: dict[str, Tensor] = field(default_factory=dict)
    inputs: dict[str, Tensor] = field(default_factory=dict)
    open: bool = True

    @property
    def has_cat(self) -> bool:
        return any(s.target == CAT for s in self.steps)

    def fits(self, step: Step, metas: dict[str, TensorMeta]) -> bool:
        if _device(step) != self.device or step.target == CAT:
            return False  # a cat starts its own group (its operands are read at shifted indices)
        if step.target in ROW_OPS and self.has_cat:
            return False  # a row kernel indexes by rows and columns, which a cat's ranges do not use
        reduced = (*self.shape[:-1], 1)
        for _, value in step.values:  # values of the group it reads must be full rows or reduced ones
            if isinstance(value, Ref) and value.name in self.defined:
                if self.defined[value.name].meta.shape not in (self.shape, reduced):
                    return False
        if step.target in ROW_OPS:
            return _reduced_input(step, metas).shape == self.shape
        shape = _out_shape(step)
        return shape == self.shape or (self.kind == "row" and shape == reduced)

    def take(self, index: int, line: KernelCall, step: Step) -> None:
        if step.target in ROW_OPS:
            self.kind = "row"
        self.members.append(index)
        self.lines.append(line)
        self.steps.append(step)
        self.step_at.append(index)
        self.defined.update((t.name, t) for t in step.outputs if t is not None)

    def _strided_rows(self) -> bool:
        """A lone row reduction of a strided input (a layer norm of a permuted tensor, as ConvNeXt's):
        ATen's kernel copies its input to a contiguous one first, the generated one reads it in place."""
        copying = {"aten.native_layer_norm.default", "aten._softmax.default", "aten._log_softmax.default"}
        lone = self.steps[0].target in copying if len(self.steps) == 1 else False
        return lone and any(not t.meta.is_contiguous() for t in self.inputs.values())

    def mergeable(self, other: _Building) -> bool:
        """`other` (open, of one shape with this group) can join it: neither read the other's values,
        or the operand's group would have closed."""
        if other.device != self.device or other.shape != self.shape:
            return False
        row = "row" in (self.kind, other.kind)
        return not (row and (self.has_cat or other.has_cat))

    def merge(self, other: _Building) -> None:
        """Take every member of `other`; members stay in body order, so steps stay in dependency order."""
        if other.kind == "row":
            self.kind = "row"
        lines = sorted(zip(self.members + other.members, self.lines + other.lines, strict=True), key=_first)
        steps = sorted(zip(self.step_at + other.step_at, self.steps + other.steps, strict=True), key=_first)
        self.members, self.lines = [m for m, _ in lines], [line for _, line in lines]
        self.step_at, self.steps = [i for i, _ in steps], [step for _, step in steps]
        self.defined.update(other.defined)
        self.inputs.update(other.inputs)

    def finish(self, read_later: dict[str, set[int]]) -> Found | None:
        if len(flat_steps(tuple(self.steps))) < 2 and not self._strided_rows():
            return None  # one node gains nothing: ATen's own kernel runs it
        members = set(self.members)
        outputs = tuple(t for name, t in self.defined.items() if read_later.get(name, set()) - members)
        if not outputs:
            return None
        group = FusedGroup(self.kind, self.shape, tuple(self.inputs.values()), outputs, tuple(self.steps))
        return Found(group, tuple(self.members), tuple(self.lines))


class _Walk:
    def __init__(self, metas: dict[str, TensorMeta], read_later: dict[str, set[int]]) -> None:
        self.metas = metas
        self.read_later = read_later
        self.owner: dict[str, _Building] = {}
        self.open: list[_Building] = []
        self.done: list[_Building] = []

    def outside(self, line: Line) -> None:
        """A line that stays: it closes the groups it reads from, or all of them if it writes memory."""
        if writes_memory(line) or isinstance(line, Return):
            self.close_all()
        for name in uses(line):
            self._close(self.owner.get(name))

    def add(self, index: int, line: KernelCall, step: Step) -> None:
        if step.target == CAT:
            self._cat(index, line, step)
            return
        operands = list(refs(tuple(v for _, v in step.values)))
        joined = next(
            (g for n in operands if (g := self.owner.get(n)) is not None and g.open and g.fits(step, self.metas)),
            None,
        )
        absorbed = []
        for name in operands:
            group = self.owner.get(name)
            if group is None or group is joined or not group.open:
                continue
            if joined is not None and joined.mergeable(group):
                self._merge(joined, group)
            elif self._broadcast_into(group, step, index):
                absorbed.append(group)
            else:
                self._close(group)
        if joined is None:
            joined = self._start(step)
            if joined is None:
                for group in absorbed:
                    self._close(group)
                return
        for group in absorbed:
            if group.open:  # once, where two operands come from one group
                self._merge(joined, group)
        for name in operands:
            if name not in joined.defined:
                joined.inputs.setdefault(name, Tensor(name, self.metas[name]))
        self._take(joined, index, line, step)

    def _broadcast_into(self, group: _Building, step: Step, index: int) -> bool:
        """A pointwise group of a smaller shape that broadcasts to the pointwise step's, whose values only
        that step reads (a squeeze-excitation's `sigmoid(s)` of [N, C, 1, 1] scaling `x` of [N, C, H, W]):
        it runs inside the step's kernel, recomputed at each element it broadcasts to, never stored."""
        if step.target in ROW_OPS or group.kind != "pointwise" or group.has_cat or group.device != _device(step):
            return False
        shape = _out_shape(step)
        if group.shape == shape or not _broadcasts(group.shape, shape):
            return False
        allowed = {*group.members, index}
        return all(self.read_later.get(name, set()) <= allowed for name in group.defined)

    def _take(self, group: _Building, index: int, line: KernelCall, step: Step) -> None:
        group.take(index, line, step)
        for t in step.outputs:
            if t is not None:
                self.owner[t.name] = group

    def _merge(self, into: _Building, other: _Building) -> None:
        into.merge(other)
        other.open = False
        self.open.remove(other)
        for name in other.defined:
            self.owner[name] = into

    def _cat(self, index: int, line: KernelCall, step: Step) -> None:
        """Start the cat's group, absorbing each open group that computes one of its operands and whose
        values nothing else reads; the other groups it reads from close."""
        operands = list(refs(tuple(v for _, v in step.values)))
        absorbed: dict[int, _Building] = {}
        for name in operands:
            group = self.owner.get(name)
            if group is None or not group.open or id(group) in absorbed:
                continue
            if self._absorbable(group, name, index):
                absorbed[id(group)] = group
            else:
                self._close(group)
        branches = tuple(
            tuple(g.steps) if (g := self.owner.get(name)) is not None and id(g) in absorbed else () for name in operands
        )
        joined = self._start(step)
        if joined is None:
            for group in absorbed.values():
                self._close(group)
            return
        for group in absorbed.values():
            group.open = False
            self.open.remove(group)
            joined.members += group.members
            joined.lines += group.lines
            joined.inputs.update(group.inputs)
        order = sorted(range(len(joined.members)), key=joined.members.__getitem__)
        joined.members = [joined.members[i] for i in order]
        joined.lines = [joined.lines[i] for i in order]
        for name, branch in zip(operands, branches, strict=True):
            if not branch:
                joined.inputs.setdefault(name, Tensor(name, self.metas[name]))
        self._take(joined, index, line, replace(step, branches=branches))

    def _absorbable(self, group: _Building, operand: str, cat: int) -> bool:
        """A pointwise group computing the operand in the operand's own shape, whose values only it and
        the cat read (it then runs inside the cat's kernel, once per range that reads it)."""
        if group.kind != "pointwise" or group.shape != self.metas[operand].shape or group.has_cat:
            return False  # a cat inside a cat's range: the inner one is written to memory instead
        allowed = {*group.members, cat}
        return all(self.read_later.get(name, set()) <= allowed for name in group.defined)

    def _start(self, step: Step) -> _Building | None:
        if step.target in ROW_OPS:
            shape = _reduced_input(step, self.metas).shape
            kind = "row"
        else:
            shape, kind = _out_shape(step), "pointwise"
        if not shape or any(n == 0 for n in shape):
            return None
        group = _Building(kind, shape, _device(step))  # type: ignore[arg-type]
        self.open.append(group)
        return group

    def _close(self, group: _Building | None) -> None:
        if group is not None and group.open:
            group.open = False
            self.open.remove(group)
            self.done.append(group)

    def close_all(self) -> None:
        for group in list(self.open):
            self._close(group)


def _broadcasts(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """`small` broadcasts to `shape` (right-aligned, each dim equal or 1), with no more dims."""
    if len(small) > len(shape):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(small), reversed(shape), strict=False))


def _first(pair: tuple[int, object]) -> int:
    return pair[0]


def _device(step: Step) -> str:
    return next(t.meta.device for t in step.outputs if t is not None)


def _out_shape(step: Step) -> tuple[int, ...]:
    first = next(t for t in step.outputs if t is not None)
    return first.meta.shape  # type: ignore[return-value]


def _reduced_input(step: Step, metas: dict[str, TensorMeta]) -> TensorMeta:
    source = dict(step.values)["input" if step.target == "aten.native_layer_norm.default" else "self"]
    assert isinstance(source, Ref)
    return metas[source.name]


def fusible(line: Line, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> bool:
    """Whether the fusion pass would take `line` into a group (a pointwise node or a row reduction)."""
    return isinstance(line, KernelCall) and _step(line, registry, metas) is not None


def _step(line: KernelCall, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> Step | None:
    """The node as a fusible step, or None where it must stay an ATen kernel."""
    if line.fallback or line.jit or line.mutates or not line.outputs:
        return None
    info = registry.by_name.get(line.kernel)
    if info is None or info.variant != "functional":
        return None
    target = _target(line.target, info.aten)
    if target not in POINTWISE and target not in ROW_OPS and target != CAT:
        return None
    try:
        values = bind(info, line.args, dict(line.kwargs))
    except BindError:
        return None
    outputs = tuple(None if v is None or v.meta is None else Tensor(v.name, v.meta) for v in line.outputs)
    tensors = [t.meta for t in outputs if t is not None]
    for value in refs(tuple(values.values())):
        meta = metas.get(value)
        if meta is None:
            return None  # a non-tensor value by name (a folded shape list): not ours
        tensors.append(meta)
    if not tensors or any(t is None for t in outputs[:1]):
        return None
    devices = {m.device for m in tensors}
    if len(devices) != 1 or not next(iter(devices)).startswith("cuda"):
        return None
    if any(not m.is_static or m.dtype not in DTYPES or m.span >= 2**31 for m in tensors):
        return None  # symbolic sizes, odd dtypes, or offsets past int32 indexing
    step = Step(line.node, target, tuple(values.items()), outputs)
    if target in ROW_OPS and not _row_op_fits(step, metas):
        return None
    if target == CAT and cat_dim(step, metas) is None:
        return None
    return step


def _target(target: str, aten: str) -> str:
    """The overload a call runs: its graph node's, or for a call a pass made (a layout copy out of a
    channels-last region, whose target says why it is there) the one its kernel binds."""
    if target in POINTWISE or target in ROW_OPS or target == CAT:
        return target
    name = aten.removeprefix("aten::")
    return f"aten.{name}" if "." in name else f"aten.{name}.default"


def cat_dim(step: Step, metas: dict[str, TensorMeta]) -> int | None:
    """The dimension a cat joins its operands along, or None where it is not a plain concatenation of
    tensors of the output's rank (ATen also skips legacy empty 1-d operands: not ours)."""
    values = dict(step.values)
    operands = values["tensors"]
    out = _out_shape(step)
    dim = values.get("dim", 0)
    if not isinstance(operands, tuple) or not operands or not isinstance(dim, int) or not -len(out) <= dim < len(out):
        return None
    dim %= len(out)
    shapes = [metas[r.name].shape for r in operands if isinstance(r, Ref)]
    if len(shapes) != len(operands) or any(len(s) != len(out) for s in shapes):
        return None
    if any(s[:dim] != out[:dim] or s[dim + 1 :] != out[dim + 1 :] or s[dim] == 0 for s in shapes):
        return None
    return dim if sum(s[dim] for s in shapes) == out[dim] else None


def _row_op_fits(step: Step, metas: dict[str, TensorMeta]) -> bool:
    """A reduction over exactly the last dimension, of a row short enough for registers."""
    values = dict(step.values)
    source = _reduced_input(step, metas)
    rank = len(source.shape)
    if rank == 0 or not 1 <= source.shape[-1] <= MAX_ROW:  # type: ignore[operator]
        return False
    if step.target == "aten.native_layer_norm.default":
        shape = values["normalized_shape"]
        return isinstance(shape, tuple) and list(shape) == [source.shape[-1]]
    dims = values[ROW_OPS[step.target]]
    dims = dims if isinstance(dims, tuple) else (dims,)
    if len(dims) != 1 or not isinstance(dims[0], int) or dims[0] not in (-1, rank - 1):
        return False
    if step.target in ("aten.sum.dim_IntList", "aten.mean.dim") and values.get("dtype") is not None:
        return False
    if step.target in ("aten._softmax.default", "aten._log_softmax.default") and values.get("half_to_float"):
        return False
    return True
