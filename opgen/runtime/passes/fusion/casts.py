"""Casts moved through views on CUDA, so that a dtype conversion joins the pointwise kernel beside it.

gpt-fast's rotary embedding converts to float32, views the result as pairs, rotates them and converts
back: `x.float().reshape(..., -1, 2)`, a `select` of each half of the pairs, products, a `stack`,
`flatten(3)`, `type_as(x)`. Fusion groups nodes over one iteration space, and the views between the
casts and the products change it: in bfloat16 both casts of q and of k ran as ATen copies, four
launches a layer beside the kernel that rotates. A cast commutes with a view, so:

- **down**: a cast read only through views (chains of them) that end at nodes fusion takes becomes,
  at each end, the same views of the cast's input, then the cast: `select(reshape(x.float()))` is
  `select(reshape(x)).float()`, which the products' kernel loads and converts itself. The views take
  the strides ATen gives them on the input (`view_strides`; a reshape that would copy stops it).
- **up**: a cast of a view (or a chain of them) of a node fusion takes, each view read by the next
  alone, becomes the same views of that node's result, cast: `flatten(y).to(bf16)` is
  `flatten(y.to(bf16))`, and the cast joins `y`'s kernel. Only where the views give the strides the
  cast's own result had.

On CUDA, static sizes; right before `lift_views` and `fusion`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from opgen.runtime.ir import (
    Arg,
    KernelCall,
    Line,
    Program,
    Ref,
    Sym,
    TensorMeta,
    Value,
    contiguous_strides,
    meta_table,
    substitute_line,
)
from opgen.runtime.passes.analysis import RESHAPES, defined_at, fresh_namer, readers, writes_between
from opgen.runtime.passes.dead_code import eliminate_dead_code
from opgen.runtime.passes.fusion.steps import fusible
from opgen.runtime.registry import KernelRegistry

CAST = "aten._to_copy.default"
SELECT, SLICE = "aten.select.int", "aten.slice.Tensor"
UNSQUEEZE, PERMUTE = "aten.unsqueeze.default", "aten.permute.default"
VIEWS = frozenset({*RESHAPES, SELECT, SLICE, UNSQUEEZE, PERMUTE})


def move_casts(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    names = fresh_namer(program, "cast")
    body = list(program.body)
    moved = False
    index = 0
    while index < len(body):  # each cast once (those a rewrite makes are past the views it moved them to)
        if _cast(body[index], metas):
            rewritten = _down(body, index, metas, registry, names) or _up(body, index, metas, registry, names)
            if rewritten is not None:
                body, moved = rewritten, True
                metas = meta_table(replace(program, body=tuple(body)))
        index += 1
    if not moved:
        return program
    return eliminate_dead_code(replace(program, body=tuple(body)), registry)


def _cast(line: Line, metas: dict[str, TensorMeta]) -> bool:
    """`_to_copy` of a static CUDA tensor that changes nothing but the dtype."""
    if not isinstance(line, KernelCall) or line.target != CAST or line.fallback or len(line.args) != 1:
        return False
    source, out = line.args[0], line.outputs[0] if len(line.outputs) == 1 else None
    meta = metas.get(source.name) if isinstance(source, Ref) else None
    if meta is None or out is None or out.meta is None or not (meta.is_static and out.meta.is_static):
        return False
    kwargs = dict(line.kwargs)
    if not set(kwargs) <= {"dtype", "layout", "device"} or kwargs.get("layout") not in (None, Sym("layout", "strided")):
        return False
    device = kwargs.get("device")
    return meta.device.startswith("cuda") and (device is None or device == Sym("device", meta.device))


def _view(line: Line) -> bool:
    return isinstance(line, KernelCall) and line.target in VIEWS and not line.fallback and len(line.outputs) == 1 \
        and bool(line.args) and isinstance(line.args[0], Ref)  # fmt: skip


def _down(body: list[Line], index: int, metas: dict[str, TensorMeta], registry: KernelRegistry,
          names: Iterator[str]) -> list[Line] | None:  # fmt: skip
    """The cast at `index` moved below the views that read it, to each of their ends; None where it cannot."""
    cast = body[index]
    assert isinstance(cast, KernelCall) and isinstance(cast.args[0], Ref) and cast.outputs[0] is not None
    read_by, made_at = readers(body), defined_at(body)
    tree: list[int] = []  # the views reading the cast, directly or through other views
    ends: dict[int, set[int]] = {}  # view index -> its readers that are not views (nodes fusion takes)
    frontier = [cast.outputs[0].name]
    while frontier:
        name = frontier.pop()
        for at in sorted(read_by.get(name, set())):
            line = body[at]
            if _view(line) and isinstance(line, KernelCall) and line.args[0] == Ref(name):
                tree.append(at)
                frontier.append(line.outputs[0].name)  # type: ignore[union-attr]
            elif name == cast.outputs[0].name or not fusible(line, registry, metas):
                return None  # the cast itself read by more than views, or a view's end that stays ATen's
            else:
                ends.setdefault(made_at[name], set()).add(at)
    if not tree or not ends or writes_between(body, index, max(tree)):
        return None  # (a write between the cast and a view could change what the moved cast reads)
    primed: dict[str, Ref] = {cast.outputs[0].name: cast.args[0]}  # original value -> the same view of the input
    made: dict[str, TensorMeta] = {}  # the new views' metas
    placed: dict[int, list[Line]] = {}
    renames: dict[int, dict[str, Arg]] = {}
    for at in sorted(tree):
        view = body[at]
        assert isinstance(view, KernelCall) and view.outputs[0] is not None and view.outputs[0].meta is not None
        source = primed[view.args[0].name]  # type: ignore[union-attr]
        meta = _viewed(view, made.get(source.name) or metas[source.name])
        if meta is None:
            return None
        value = Value(next(names), meta)
        made[value.name] = meta
        primed[view.outputs[0].name] = Ref(value.name)
        lines: list[Line] = [replace(view, args=(source, *view.args[1:]), outputs=(value,))]
        if at in ends:
            out = view.outputs[0].meta
            dtype = cast.outputs[0].meta.dtype  # type: ignore[union-attr]
            converted = Value(next(names), TensorMeta(out.shape, contiguous_strides(out.shape), dtype, out.device))  # type: ignore[arg-type]
            lines.append(replace(cast, args=(Ref(value.name),), outputs=(converted,)))
            for reader in ends[at]:
                renames.setdefault(reader, {})[view.outputs[0].name] = Ref(converted.name)
        placed[at] = lines
    out: list[Line] = []
    for at, line in enumerate(body):
        if at in placed:
            out.append(line)  # the original view stays for dead-code removal (nothing reads it after this)
            out.extend(placed[at])
        else:
            out.append(substitute_line(line, renames[at]) if at in renames else line)
    return out


def _up(body: list[Line], index: int, metas: dict[str, TensorMeta], registry: KernelRegistry,
        names: Iterator[str]) -> list[Line] | None:  # fmt: skip
    """The cast at `index` moved above the chain of views it reads, onto the fusible node at its top."""
    cast = body[index]
    assert isinstance(cast, KernelCall) and isinstance(cast.args[0], Ref) and cast.outputs[0] is not None
    read_by, made_at = readers(body), defined_at(body)
    chain: list[int] = []
    name, reader = cast.args[0].name, index
    while (at := made_at.get(name)) is not None and _view(body[at]) and read_by.get(name) == {reader}:
        chain.append(at)
        name, reader = body[at].args[0].name, at  # type: ignore[union-attr]
    top = made_at.get(name)
    if not chain or top is None or not fusible(body[top], registry, metas) or writes_between(body, top, index):
        return None
    dtype = cast.outputs[0].meta.dtype  # type: ignore[union-attr]
    converted = Value(next(names), replace(metas[name], dtype=dtype))
    views: list[Line] = []
    source: Arg = Ref(converted.name)
    for at in reversed(chain):
        view = body[at]
        assert isinstance(view, KernelCall) and view.outputs[0] is not None and view.outputs[0].meta is not None
        last = at == chain[0]
        value = Value(cast.outputs[0].name if last else next(names), replace(view.outputs[0].meta, dtype=dtype))
        views.append(replace(view, args=(source, *view.args[1:]), outputs=(value,)))
        source = Ref(value.name)
    final = views[-1].outputs[0].meta  # type: ignore[union-attr]
    if (final.stride, final.offset) != (cast.outputs[0].meta.stride, cast.outputs[0].meta.offset):  # type: ignore[union-attr]
        return None  # readers of the cast's result see other strides
    out: list[Line] = []
    for at, line in enumerate(body):
        if at == index:
            out.extend(views)  # the cast's result, now a view of the converted value
            continue
        out.append(line)
        if at == top:
            out.append(replace(cast, args=(Ref(name),), outputs=(converted,)))  # beside its source: one kernel
    return out


def _viewed(view: KernelCall, meta: TensorMeta) -> TensorMeta | None:
    """`meta` viewed as `view` views its source (ATen's strides for it), in `view`'s output shape."""
    out = view.outputs[0].meta  # type: ignore[union-attr]
    assert out is not None
    shape, stride, offset = tuple(meta.shape), tuple(meta.stride), meta.offset
    args = view.args
    if view.target in RESHAPES:
        strides = view_strides(shape, stride, tuple(out.shape))  # type: ignore[arg-type]
        return None if strides is None else replace(meta, shape=out.shape, stride=strides)
    rank = len(shape)
    if view.target == PERMUTE:
        dims = tuple(int(d) % rank for d in args[1])  # type: ignore[union-attr]
        return replace(meta, shape=tuple(shape[d] for d in dims), stride=tuple(stride[d] for d in dims))
    if view.target == UNSQUEEZE:
        dim = int(args[1]) % (rank + 1)  # type: ignore[call-overload]
        inserted = shape[dim] * stride[dim] if dim < rank else 1
        return replace(meta, shape=out.shape, stride=(*stride[:dim], inserted, *stride[dim:]))
    if view.target == SELECT:
        dim, at = int(args[1]) % rank, int(args[2])  # type: ignore[call-overload]
        at %= shape[dim]  # type: ignore[operator]
        return replace(meta, shape=out.shape, stride=(*stride[:dim], *stride[dim + 1 :]),
                       offset=offset + at * stride[dim])  # type: ignore[operator]  # fmt: skip
    if view.target == SLICE:
        dim = int(args[1]) % rank if len(args) > 1 else 0  # type: ignore[call-overload]
        start = args[2] if len(args) > 2 and args[2] is not None else 0
        step = int(args[4]) if len(args) > 4 else 1  # type: ignore[call-overload]
        if not isinstance(start, int) or view.kwargs:
            return None
        start = min(max(start + shape[dim] if start < 0 else start, 0), shape[dim])  # type: ignore[operator]
        strides = (*stride[:dim], stride[dim] * step, *stride[dim + 1 :])  # type: ignore[operator]
        return replace(meta, shape=out.shape, stride=strides, offset=offset + start * stride[dim])  # type: ignore[operator]
    return None


def view_strides(shape: tuple[int, ...], stride: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides ATen's `view` gives a tensor of `shape`/`stride` viewed as `new`, or None where it cannot
    (a reshape would copy): `at::detail::computeStride`, chunk by chunk of dimensions laid out together."""
    if 0 in shape or 0 in new:
        return None
    if not shape:
        return tuple(1 for _ in new)
    out = [0] * len(new)
    view_d = len(new) - 1
    chunk_base = stride[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and stride[tensor_d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * chunk_base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base = stride[tensor_d - 1]
                tensor_numel = view_numel = 1
    return tuple(out) if view_d == -1 else None
