"""Permutes above pointwise nodes on CUDA, so that the nodes before and after a permute fuse as one.

`permute(f(a, b), dims)`, where the pointwise node `f` is read by the permute alone, is
`f(permute(a, dims), permute(b, dims))`: the operands are viewed in the permuted order (an operand
that broadcasts first gets its leading size-1 dimensions), and `f` writes its result in that order.
The fusion pass puts a group's nodes in one kernel only where they share an iteration space, and a
permute changes it: ConvNeXt's block ends with `linear -> permute -> mul(layer scale) -> add(residual)`,
whose bias add (from `split_bias`) ran in one kernel and the scale and the residual add in another.
After this pass the three are one kernel that reads the product through the permute, as Inductor's
`triton_poi_fused_add_addmm_mul_permute_view` does. A pointwise node's loads follow its operands'
strides, so the permuted views cost no copy.

Only where every reader of the permute is a node fusion takes (so the kernel count drops) and nothing
returns it (the caller sees eager's strides), on CUDA with static sizes; right before `fusion`.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, TensorMeta, Value, contiguous_strides, meta_table
from opgen.runtime.passes.analysis import defined_at, fresh_namer, readers
from opgen.runtime.passes.fusion.ops import POINTWISE
from opgen.runtime.passes.fusion.steps import fusible, step_of
from opgen.runtime.registry import KernelRegistry

PERMUTE, VIEW = "aten.permute.default", "aten.view.default"
ROUNDS = 8  # a permute moves above a chain of at most this many pointwise nodes


def permutes_into_pointwise(program: Program, registry: KernelRegistry) -> Program:
    if not {"permute", "view"} <= set(registry.by_name):
        return program
    for _ in range(ROUNDS):  # each round moves every permute one node up; the next sees the new ones
        moved = _one_round(program, registry)
        if moved is program:
            break
        program = moved
    return program


def _one_round(program: Program, registry: KernelRegistry) -> Program:
    """Each permute whose source a pointwise node makes for it alone, moved above that node."""
    metas, read_by = meta_table(program), readers(program.body)
    made_at, names = defined_at(program.body), fresh_namer(program, "permuted")
    dropped: set[int] = set()
    placed: dict[int, list[Line]] = {}  # permute index -> the operands' views and the node, in its place
    for index, line in enumerate(program.body):
        dims = _permute(line, metas)
        if dims is None:
            continue
        assert isinstance(line, KernelCall) and line.outputs[0] is not None and isinstance(line.args[0], Ref)
        out, source = line.outputs[0], line.args[0].name
        at = made_at.get(source)
        node = program.body[at] if at is not None else None
        if at is None or not isinstance(node, KernelCall) or read_by.get(source) != {index}:
            continue
        if not _pointwise(node, registry, metas) or not _fused_after(out.name, read_by, program.body, registry, metas):
            continue
        views: list[Line] = []
        args = tuple(_operand(a, dims, metas, names, views, line.node) for a in node.args)
        kwargs = tuple((k, _operand(a, dims, metas, names, views, line.node)) for k, a in node.kwargs)
        assert out.meta is not None
        fresh = replace(out.meta, stride=contiguous_strides(out.meta.shape), offset=0)  # type: ignore[arg-type]
        dropped.add(at)
        placed[index] = [*views, replace(node, args=args, kwargs=kwargs, outputs=(Value(out.name, fresh),))]
    if not placed:
        return program
    body: list[Line] = []
    for index, line in enumerate(program.body):
        if index not in dropped:
            body.extend(placed.get(index, [line]))
    return replace(program, body=tuple(body))


def _permute(line: Line, metas: dict[str, TensorMeta]) -> tuple[int, ...] | None:
    """The dims of a CUDA permute of a static tensor, or None."""
    if not isinstance(line, KernelCall) or line.target != PERMUTE or line.fallback or len(line.outputs) != 1:
        return None
    out, source = line.outputs[0], line.args[0] if line.args else None
    dims = line.args[1] if len(line.args) > 1 else None
    meta = metas.get(source.name) if isinstance(source, Ref) else None
    if out is None or out.meta is None or meta is None or not isinstance(dims, tuple):
        return None
    if not (meta.device.startswith("cuda") and meta.is_static and meta.is_contiguous()):
        return None
    rank = len(meta.shape)
    dims = tuple(d % rank for d in dims) if all(isinstance(d, int) for d in dims) else ()
    return dims if sorted(dims) == list(range(rank)) else None


def _pointwise(node: KernelCall, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> bool:
    step = step_of(node, registry, metas)
    return step is not None and step.target in POINTWISE and len(node.outputs) == 1


def _fused_after(
    name: str, read_by: dict[str, set[int]], body: tuple[Line, ...], registry: KernelRegistry,
    metas: dict[str, TensorMeta],
) -> bool:  # fmt: skip
    """Every reader of the permute is a node fusion takes (a Return is not: the caller sees the view)."""
    at = read_by.get(name, set())
    return bool(at) and all(fusible(body[i], registry, metas) for i in at)


def _operand(
    arg: Arg, dims: tuple[int, ...], metas: dict[str, TensorMeta], names: object, views: list[Line], node: str
) -> Arg:
    """A tensor operand viewed in the permuted order (through a view with leading 1s where it
    broadcasts from fewer dimensions); scalars and 0-d tensors as they are."""
    meta = metas.get(arg.name) if isinstance(arg, Ref) else None
    if meta is None or not meta.shape:
        return arg
    assert isinstance(arg, Ref)
    rank = len(dims)
    if len(meta.shape) < rank:
        padded = (1,) * (rank - len(meta.shape)) + meta.shape
        stride = (meta.stride[0] * meta.shape[0],) * (rank - len(meta.shape)) + meta.stride  # type: ignore[operator]
        meta = replace(meta, shape=padded, stride=stride)
        arg = _view_line(views, names, node, "view", VIEW, (arg, padded), meta)
    permuted = replace(meta, shape=tuple(meta.shape[d] for d in dims), stride=tuple(meta.stride[d] for d in dims))
    return _view_line(views, names, node, "permute", PERMUTE, (arg, dims), permuted)


def _view_line(
    views: list[Line], names: object, node: str, kernel: str, target: str, args: tuple[Arg, ...],
    meta: TensorMeta,
) -> Ref:  # fmt: skip
    value = Value(next(names), meta)  # type: ignore[call-overload]
    views.append(KernelCall(kernel, args, (), (value,), node, target))
    return Ref(value.name)
