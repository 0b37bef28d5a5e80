"""Re-inplacing: functional writes into a buffer become in-place kernels, and the write-back goes.

torch.export functionalizes a write into a buffer (a KV cache's `index_put_`, `index_copy_`, `copy_`
into a slice): the graph computes a new value of the whole buffer (`index_put(cache, idx, v)`,
`slice_scatter(cache, src, ...)`, which copy it) and lowering copies that value back into the buffer
after the graph ran (`copy_(cache, new)`, the "write back"). Eager writes one slot.

For each buffer (a mutable constant, or an input with a write-back) the pass walks the chain of
functional writes the written-back value comes from and, where it is safe, writes the buffer itself:

- `f(base, ...)` with an in-place variant `f_` taking the same arguments (`index_put` ->
  `index_put_`, `scatter` ...), whose result has the base's shape and dtype, becomes `f_(base, ...)`;
- `copy(x, src)` becomes `copy_(x, src)` (x is read for its shape only; nothing where src is x);
- `slice_scatter`/`select_scatter(base, src, ...)` become `copy_` of src into the slice/select view of
  base, and nothing where src already is that view, written in place (a write through a view);
- a fallback `index_copy(base, d, index, src)` becomes `index_put_(base, (None,) * d + (index,), src)`;
- `clone`s and views of the new value are the buffer (or its view) itself;
- the write-back of a value that is now the buffer itself disappears.

Safety (Inductor's reinplace rules, `torch/_inductor/fx_passes/reinplace.py`) is proved by a walk over
every line touching the buffer's storage
(its views, and the results now written into it), each name standing for a region of the storage
and the regions written since its value was current: a write makes every other name stale; a line
may read a name only while it is current (no later reader of the old value; readers of the new value
read the buffer); a scatter's base may be stale only inside the region it overwrites; a result laid
out unlike its region (other strides) is read only by the chain. The buffer stays functional, with
a note for `report()`, where any rule fails, where a rewritten value would be returned (the caller
would get the buffer itself), or where another line writes the storage. Run before constant folding
(views of the buffer stay in the body) and memory planning (which must see the in-place writes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from opgen.runtime.ir import (
    Arg,
    Free,
    KernelCall,
    Line,
    Program,
    Ref,
    Return,
    TensorMeta,
    Value,
    View,
    meta_table,
    producers,
    refs,
    substitute,
    substitute_line,
    uses,
)
from opgen.runtime.passes.analysis import arg_value, fresh_namer, info_of, is_view_call
from opgen.runtime.passes.regions import select_meta, slice_meta, within
from opgen.runtime.registry import KernelRegistry, OpInfo, call_args

SCATTERS = {"aten::slice_scatter": "slice", "aten::select_scatter": "select"}
INDEX_COPY = "aten.index_copy.default"


class _Keep(Exception):
    """The buffer stays functional; the message says why (a note for `report()`)."""


@dataclass
class _Alias:
    """A name that views the buffer's storage: the region it views and what was written since."""

    region: TensorMeta | None  # None: a region the pass cannot describe
    stale: list[TensorMeta | None] = field(default_factory=list)  # regions written since its value was current
    relaid: bool = False  # its own meta differs from its region's: only chain lines may read it
    new: bool = False  # a value that views the buffer only because of this pass (never returned)


def reinplace(program: Program, registry: KernelRegistry) -> Program:
    done, kept = [], []
    for buffer in _written_back(program):
        try:
            program = _Rewrite(program, registry, buffer).run()
            done.append(buffer)
        except _Keep as reason:
            kept.append(f"{buffer} ({reason})")
    if not done and not kept:
        return program
    note = f"reinplace: {len(done)} buffers written in place" + "".join(f"; kept functional: {k}" for k in kept)
    return replace(program, notes=(*program.notes, note))


def _written_back(program: Program) -> list[str]:
    """Buffers with a write-back `copy_(buffer, value)`: mutable constants and inputs."""
    buffers = {c.name for c in program.constants if c.mutable} | {i.name for i in program.inputs}
    written = [line.args[0].name for line in program.body if _is_copy_into(line)]  # type: ignore[union-attr]
    return list(dict.fromkeys(n for n in written if n in buffers))


def _is_copy_into(line: Line) -> bool:
    return (
        isinstance(line, KernelCall)
        and line.kernel == "copy_"
        and not line.fallback
        and len(line.args) == 2
        and isinstance(line.args[0], Ref)
        and isinstance(line.args[1], Ref)
        and line.mutates == (line.args[0].name,)
    )


@dataclass
class _Rewrite:
    program: Program
    registry: KernelRegistry
    buffer: str
    names: dict[str, _Alias] = field(default_factory=dict)
    rename: dict[str, Arg] = field(default_factory=dict)
    changed: bool = False

    def __post_init__(self) -> None:
        self.metas = meta_table(self.program)
        self.chain = self.chain_of()
        self.fresh = fresh_namer(self.program, "buf")

    def run(self) -> Program:
        self.names[self.buffer] = _Alias(self.metas[self.buffer])
        for line in (*self.program.setup, *self.program.memo):
            if set(uses(line)) & set(self.names):
                if not self.view(line):
                    raise _Keep("a setup line reads it")
        body: list[Line] = []
        for line in self.program.body:
            body += self.step(line)
        if not self.changed:
            raise _Keep("no write to rewrite")
        return replace(self.program, body=tuple(body))

    def chain_of(self) -> set[str]:
        """Values the written-back value is computed from through writes (their bases and sources)."""
        made = producers(self.program.body)
        back = [line.args[1] for line in self.program.body if self.is_write_back(line)]  # type: ignore[union-attr]
        if len(back) != 1:
            raise _Keep("written back more than once")
        todo, chain = list(refs(back[0])), set()
        while todo:
            name = todo.pop()
            line = made.get(name)
            kind = self.write_kind(line) if line is not None and name not in chain else None
            if line is not None and kind is None and is_view_call(line, self.registry):
                kind = "view"  # the written-back value is a view of a write's result
            if line is None or kind is None:
                continue
            chain.add(name)
            sources = line.args[:2] if kind in ("copy", "scatter") else line.args[:1]
            todo += [a.name for a in sources if isinstance(a, Ref)]
        return chain

    def is_write_back(self, line: Line) -> bool:
        return _is_copy_into(line) and isinstance(line, KernelCall) and line.args[0] == Ref(self.buffer)

    def write_kind(self, line: KernelCall) -> str | None:
        """'copy', 'scatter', 'index_copy', 'inplace' (a functional op with an in-place variant) or None."""
        if line.fallback:
            return "index_copy" if line.target == INDEX_COPY and "index_put_" in self.registry.by_name else None
        info = info_of(line, self.registry)
        if info is None or info.variant != "functional" or info.is_view or len(line.outputs) != 1 or line.unpack:
            return None
        if info.aten == "aten::clone":
            return "clone"
        if info.aten == "aten::copy":
            return "copy" if "copy_" in self.registry.by_name else None
        if info.aten in SCATTERS:
            return "scatter" if {"copy_", SCATTERS[info.aten]} <= set(self.registry.by_name) else None
        inplace = self.registry.sibling(info, "inplace")
        same = inplace is not None and [a.name for a in inplace.args] == [a.name for a in info.args]
        return "inplace" if same else None

    # --- one line ------------------------------------------------------------------------------------

    def step(self, line: Line) -> list[Line]:
        touched = {n for n in uses(line) if n in self.names}
        if isinstance(line, Free):  # a rewritten value is the buffer now: never deleted
            kept = tuple(n for n in line.names if n not in self.rename)
            return [Free(kept)] if kept else []
        if not touched:
            return [substitute_line(line, self.rename)]
        if isinstance(line, KernelCall) and set(line.mutates) & touched:
            if self.is_write_back(line):
                return self.write_back(line)
            raise _Keep(f"'{line.node}' writes it")
        if self.view(line):
            return [substitute_line(line, self.rename)]
        if isinstance(line, KernelCall) and self.in_chain(line):
            return self.write(line)
        self.read(line, touched)
        return [substitute_line(line, self.rename)]

    def in_chain(self, line: KernelCall) -> bool:
        """A write the written-back value comes from, into a name that views the buffer."""
        out = line.outputs[0] if line.outputs else None
        base = line.args[0] if line.args else None
        return out is not None and out.name in self.chain and isinstance(base, Ref) and base.name in self.names

    def read(self, line: Line, touched: set[str]) -> None:
        for name in sorted(touched):
            alias = self.names[name]
            if alias.stale:
                raise _Keep(f"'{_node(line)}' reads '{name}' after a write (the old value)")
            if alias.relaid or (alias.new and isinstance(line, Return)):
                raise _Keep(f"'{_node(line)}' reads the rewritten '{name}'")
        if isinstance(line, KernelCall) and line.fallback and not line.fresh:  # results may alias arguments
            new = any(self.names[n].new for n in touched)
            for value in line.outputs:
                if value is not None:
                    self.names[value.name] = _Alias(None, new=new)

    def view(self, line: Line) -> bool:
        """A view of a name that views the buffer: a new name for its region (no data read)."""
        values: tuple[Value, ...]
        if isinstance(line, View) and line.source in self.names:
            source, values = self.names[line.source], (line.value,)
        elif is_view_call(line, self.registry) and isinstance(line, KernelCall):
            info = info_of(line, self.registry)
            assert info is not None and info.view_source is not None
            sources = [n for n in refs(arg_value(line, info, info.view_source)) if n in self.names]
            if not sources:
                return False
            source, values = self.names[sources[0]], tuple(v for v in line.outputs if v is not None)
        else:
            return False
        if source.relaid:
            raise _Keep(f"'{_node(line)}' views the rewritten value")
        for value in values:
            self.names[value.name] = _Alias(value.meta, list(source.stale), new=source.new)
        return True

    # --- writes ------------------------------------------------------------------------------------

    def write(self, line: KernelCall) -> list[Line]:
        kind = self.write_kind(line)
        base = line.args[0]
        assert isinstance(base, Ref)
        others = set(refs((*line.args[1:], *(v for _, v in line.kwargs))))
        if kind == "copy":
            return self.copy(line, base.name, line.args[1])
        if kind == "clone":  # of the new value, written back: the buffer itself
            self.current(base.name, None, line)
            self.written(line, base.name, wrote=False)
            return []
        if kind == "scatter":
            return self.scatter(line, base.name, line.args[1])
        if others & set(self.names):
            raise _Keep(f"'{line.node}' reads it beside writing it")
        self.current(base.name, None, line)
        region, out = self.names[base.name].region, line.outputs[0]
        meta = out.meta if out is not None else None
        if region is None or meta is None or (meta.shape, meta.dtype) != (region.shape, region.dtype):
            raise _Keep(f"'{line.node}' computes a value shaped unlike what it writes")
        if kind == "index_copy":
            call = self.index_put(line)
        else:
            info = info_of(line, self.registry)
            inplace = self.registry.sibling(info, "inplace")  # type: ignore[arg-type]
            assert inplace is not None
            call = replace(line, kernel=inplace.name, outputs=(), mutates=(base.name,), fresh=False)
        self.written(line, base.name)
        return [substitute_line(call, self.rename)]

    def index_put(self, line: KernelCall) -> KernelCall:
        """index_copy(base, d, index, src) == index_put_(base, (None,) * d + (index,), src)."""
        if len(line.args) != 4 or line.kwargs:
            raise _Keep(f"'{line.node}': index_copy called with keywords")
        base, dim, index, source = line.args
        assert isinstance(base, Ref)
        region = self.names[base.name].region
        rank = len(region.shape) if region is not None else 0
        if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
            raise _Keep(f"'{line.node}': index_copy along a dimension the pass cannot check")
        indices = (*(None,) * (dim % rank), index)
        return KernelCall("index_put_", (base, indices, source), (), (), line.node, line.target, mutates=(base.name,))

    def copy(self, line: KernelCall, x: str, src: Arg) -> list[Line]:
        """`copy(x, src)`: x's region becomes src (x is read for its shape only)."""
        region = self.names[x].region
        if isinstance(src, Ref) and src.name in self.names:
            self.same_region(src.name, region, line)
            self.written(line, x, wrote=False)
            return []
        call = replace(line, kernel="copy_", outputs=(), mutates=(x,))
        self.written(line, x)
        return [substitute_line(call, self.rename)]

    def scatter(self, line: KernelCall, base: str, src: Arg) -> list[Line]:
        """`slice_scatter`/`select_scatter(base, src, ...)`: `copy_` of src into the view of base."""
        info = info_of(line, self.registry)
        assert info is not None
        target = self.target(line, info, base)
        self.current(base, target, line)
        if isinstance(src, Ref) and src.name in self.names:
            self.same_region(src.name, target, line)
            self.written(line, base, wrote=False)
            return []
        if set(refs(src)) & set(self.names):
            raise _Keep(f"'{line.node}' scatters a value that views it")
        view = self.view_call(line, info, base, target)
        self.names[view.outputs[0].name] = _Alias(target, new=True)  # type: ignore[union-attr]
        name = view.outputs[0].name  # type: ignore[union-attr]
        copy = KernelCall("copy_", (Ref(name), src), (), (), line.node, line.target, mutates=(name,))
        self.written(line, base, region=target)
        return [substitute_line(view, self.rename), substitute_line(copy, self.rename)]

    def target(self, line: KernelCall, info: OpInfo, base: str) -> TensorMeta:
        region = self.names[base].region
        values = [arg_value(line, info, a.name) for a in info.args[2:]]
        ints = [v for v in values if v is None or (isinstance(v, int) and not isinstance(v, bool))]
        if region is None or self.names[base].relaid or not region.is_static or len(ints) != len(values):
            raise _Keep(f"'{line.node}' scatters where the pass cannot compute the region")
        meta = slice_meta(region, *ints) if info.aten == "aten::slice_scatter" else select_meta(region, *ints)  # type: ignore[arg-type]
        if meta is None:
            raise _Keep(f"'{line.node}' scatters out of bounds")
        return meta

    def view_call(self, line: KernelCall, info: OpInfo, base: str, target: TensorMeta) -> KernelCall:
        view = self.registry.by_name[SCATTERS[info.aten]]
        values = {"self": Ref(base)} | {a.name: arg_value(line, info, a.name) for a in info.args[2:]}
        args, kwargs = call_args(view, values)  # defaults left out, as lowering prints them
        aten = "aten.slice.Tensor" if view.name == "slice" else "aten.select.int"
        return KernelCall(view.name, args, kwargs, (Value(next(self.fresh), target),), line.node, aten)

    def write_back(self, line: KernelCall) -> list[Line]:
        """`copy_(buffer, value)`: nothing where the value is the buffer now."""
        value = line.args[1]
        assert isinstance(value, Ref)
        if value.name in self.names:
            self.same_region(value.name, self.names[self.buffer].region, line)
            self.names[self.buffer] = _Alias(self.names[self.buffer].region)
            return []
        for alias in self.names.values():  # a fresh value copied in: the buffer's region changes
            alias.stale.append(self.names[self.buffer].region)
        self.names[self.buffer] = _Alias(self.names[self.buffer].region)
        return [substitute_line(line, self.rename)]

    # --- the rules ----------------------------------------------------------------------------------

    def current(self, name: str, overwritten: TensorMeta | None, line: KernelCall) -> None:
        """`name` holds its value, except perhaps inside `overwritten` (a region the line writes anew)."""
        alias = self.names[name]
        if not all(within(region, overwritten) for region in alias.stale):
            raise _Keep(f"'{line.node}' writes '{name}' after a write to it that it does not cover")

    def same_region(self, name: str, region: TensorMeta | None, line: KernelCall) -> None:
        alias = self.names[name]
        if alias.stale or region is None or alias.region != region:
            raise _Keep(f"'{line.node}' copies between different regions of it")

    def written(self, line: KernelCall, base: str, wrote: bool = True, region: TensorMeta | None = None) -> None:
        """After a write into `base` (its region, or `region`): others are stale; the result is the base."""
        region = region or self.names[base].region
        if wrote:
            self.changed = True
            for alias in self.names.values():
                alias.stale.append(region)
        out = line.outputs[0]
        assert out is not None
        kept = self.names[base].region
        relaid = out.meta != kept and not (out.meta is not None and kept is not None and out.meta.same_layout(kept))
        self.names[out.name] = _Alias(kept, relaid=relaid, new=True)
        self.rename[out.name] = substitute(Ref(base), self.rename)
        self.changed = True


def _node(line: Line) -> str:
    return line.node if isinstance(line, KernelCall | View) and line.node else type(line).__name__
