"""Views above pointwise nodes on CUDA, so that the nodes before and after a view fuse as one kernel.

`view(f(a, b))`, where the pointwise node `f` is read by the view alone, is `f(view(a), view(b))`:
each operand is viewed the same way (one that broadcasts, the way that keeps it broadcasting), and
`f` writes its result in the view's shape. The fusion pass puts nodes in one kernel only where they
share an iteration space, and a view changes it:

- a permute: ConvNeXt's block ends with `linear -> permute -> mul(layer scale) -> add(residual)`; the
  bias add (from `split_bias`) ran in one kernel, the scale and the residual add in another. Lifted,
  the three are one kernel that reads the product through the permute, as Inductor's
  `triton_poi_fused_add_addmm_mul_permute_view` does.
- a reshape: Swin's `x + attn(...)` over (B, H, W, C), reshaped to (B, H*W, C) for the next layer
  norm; lifted, the residual add and the norm are one row kernel.
- an unsqueeze: gpt-fast's rotary embedding `torch.stack`s its rotated pairs, a cat of unsqueezes;
  lifted up to the pairs' loads (an unsqueeze views any operand, whatever its strides), the
  products, the sums and the stack are one kernel.
- a chain of them: transformers' causal mask compares the key positions with the query's, `add(arange,
  cache_position)` unsqueezed three times, and its rotary embedding multiplies the inverse frequencies
  by the position twice unsqueezed. A chain of reshapes of a contiguous tensor, each link read only by
  the next, is first one view of it (`_composed`), which then moves above the node: the add becomes one
  of [1, 1, 1, 1] that broadcasts into the comparison's kernel (and the position's cast into the
  rotation's), where it ran as a kernel of its own.

A pointwise node's loads follow its operands' strides, so the permuted views cost no copy. Only where
every reader of the view is a node fusion takes (so kernels merge) and nothing returns it (the caller
sees eager's strides), on CUDA with static sizes; right before `fusion`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, TensorMeta, Value, contiguous_strides, meta_table
from opgen.runtime.ir.fusible import PERMUTE, POINTWISE, VIEW
from opgen.runtime.passes.analysis import RESHAPES, defined_at, fresh_namer, readers
from opgen.runtime.passes.fusion.steps import fusible, step_of
from opgen.runtime.passes.regions import dense
from opgen.runtime.registry import KernelRegistry

ROUNDS = 8  # a view moves above a chain of at most this many pointwise nodes
UNSQUEEZE = "aten.unsqueeze.default"  # a reshape too: gpt-fast's rotary `stack`s its pairs as cat(unsqueeze, ...)
RESHAPING = frozenset((*RESHAPES, UNSQUEEZE))  # the calls that only reshape their tensor


def lift_views(program: Program, registry: KernelRegistry) -> Program:
    if not {"permute", "view"} <= set(registry.by_name):
        return program
    program = _composed(program)
    for _ in range(ROUNDS):  # each round moves every view one node up; the next sees the views it made
        lifted = _one_round(program, registry)
        if lifted is program:
            break
        program = lifted
    return program


def _one_round(program: Program, registry: KernelRegistry) -> Program:
    """Each view whose source a pointwise node makes for it alone, moved above that node."""
    metas, read_by = meta_table(program), readers(program.body)
    made_at, names = defined_at(program.body), fresh_namer(program, "lifted")
    dropped: set[int] = set()
    placed: dict[int, list[Line]] = {}  # view index -> the operands' views and the node, in its place
    for index, line in enumerate(program.body):
        if not _a_view(line, metas):
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
        lift = _Lift(line, metas, names, views)
        args = tuple(lift(a) for a in node.args)
        kwargs = tuple((k, lift(a)) for k, a in node.kwargs)
        if lift.failed:
            continue
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


def _composed(program: Program) -> Program:
    """Each chain of reshapes (`RESHAPING`) of a static, contiguous CUDA tensor, every link read
    only by the next, as one `view` of the tensor in the chain's last shape (contiguous too); the links
    between go."""
    metas, read_by, made_at = meta_table(program), readers(program.body), defined_at(program.body)
    body, dropped = list(program.body), set()
    for index, line in enumerate(body):
        at = made_at.get(line.args[0].name) if _a_reshape(line) else None  # type: ignore[union-attr]
        inner = body[at] if at is not None else None
        if at is None or not _a_reshape(inner) or read_by.get(line.args[0].name) != {index}:  # type: ignore[union-attr]
            continue
        assert isinstance(line, KernelCall) and isinstance(inner, KernelCall) and line.outputs[0] is not None
        root, out = inner.args[0], line.outputs[0].meta
        meta = metas.get(root.name) if isinstance(root, Ref) else None
        if meta is None or out is None or not meta.device.startswith("cuda"):
            continue
        if not (meta.is_static and meta.is_contiguous() and out.is_static and out.is_contiguous()):
            continue
        body[index] = KernelCall("view", (root, out.shape), (), line.outputs, line.node, VIEW)
        dropped.add(at)
    if not dropped:
        return program
    return replace(program, body=tuple(line for i, line in enumerate(body) if i not in dropped))


def _a_reshape(line: Line | None) -> bool:
    """A call that only reshapes its first argument, a named tensor, into one static result."""
    if not isinstance(line, KernelCall) or line.fallback or len(line.outputs) != 1 or not line.args:
        return False
    out = line.outputs[0]
    return line.target in RESHAPING and isinstance(line.args[0], Ref) and out is not None and out.meta is not None


def _a_view(line: Line, metas: dict[str, TensorMeta]) -> bool:
    """A CUDA permute or reshape of a static, contiguous tensor (a pointwise node's fresh result); a
    permute also of a dense one in another order (a channels-last value, as ConvNeXt's bias add after
    its depthwise convolution)."""
    if not isinstance(line, KernelCall) or line.fallback or len(line.outputs) != 1 or len(line.args) < 2:
        return False
    if line.target != PERMUTE and line.target not in RESHAPING:
        return False
    out, source = line.outputs[0], line.args[0]
    meta = metas.get(source.name) if isinstance(source, Ref) else None
    if out is None or out.meta is None or not out.meta.is_static or meta is None:
        return False
    if not (meta.device.startswith("cuda") and meta.is_static):
        return False
    return meta.is_contiguous() or (line.target == PERMUTE and dense(meta) and meta.offset == 0)


def _pointwise(node: KernelCall, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> bool:
    step = step_of(node, registry, metas)
    return step is not None and step.target in POINTWISE and len(node.outputs) == 1


def _fused_after(
    name: str, read_by: dict[str, set[int]], body: tuple[Line, ...], registry: KernelRegistry,
    metas: dict[str, TensorMeta],
) -> bool:  # fmt: skip
    """Every reader of the view is a node fusion takes (a Return is not: the caller sees the view)."""
    at = read_by.get(name, set())
    return bool(at) and all(fusible(body[i], registry, metas) for i in at)


class _Lift:
    """Maps the node's operands through the view (`failed` where one cannot follow it)."""

    def __init__(self, view: KernelCall, metas: dict[str, TensorMeta], names: Iterator[str], lines: list[Line]) -> None:
        source, out = view.args[0], view.outputs[0]
        assert isinstance(source, Ref) and out is not None and out.meta is not None
        self.view, self.metas, self.names, self.lines = view, metas, names, lines
        self.before, self.after = metas[source.name].shape, out.meta.shape
        self.failed = False

    def __call__(self, arg: Arg) -> Arg:
        meta = self.metas.get(arg.name) if isinstance(arg, Ref) else None
        if meta is None or not meta.shape:
            return arg  # scalars and 0-d tensors broadcast to any shape
        assert isinstance(arg, Ref)
        if self.view.target == PERMUTE:
            return self._permuted(arg, meta)
        return self._reshaped(arg, meta)

    def _permuted(self, arg: Ref, meta: TensorMeta) -> Arg:
        rank, given = len(self.before), self.view.args[1]
        dims = tuple(d % rank for d in given if isinstance(d, int)) if isinstance(given, tuple) else ()
        if sorted(dims) != list(range(rank)):  # a permutation of every dimension, each an int
            self.failed = True
            return arg
        if len(meta.shape) < rank:  # broadcast from fewer dimensions: leading 1s first
            padded = (1,) * (rank - len(meta.shape)) + meta.shape
            lead = (meta.stride[0] * meta.shape[0],) * (rank - len(meta.shape))  # type: ignore[operator]
            meta = replace(meta, shape=padded, stride=(*lead, *meta.stride))
            arg = self._line("view", VIEW, (arg, padded), meta)
        permuted = replace(meta, shape=tuple(meta.shape[d] for d in dims), stride=tuple(meta.stride[d] for d in dims))
        return self._line("permute", PERMUTE, (arg, dims), permuted)

    def _reshaped(self, arg: Ref, meta: TensorMeta) -> Arg:
        """The whole operand reshaped like the node's result (it must be contiguous for a view), or one
        that broadcasts over dimensions the reshape leaves alone, as it is. A reshape that only inserts
        dimensions of size 1 (an unsqueeze) views any operand, whatever its strides or broadcast."""
        inserted = _inserted_ones(self.before, self.after)
        if inserted is not None and len(meta.shape) <= len(self.before):
            padded = [1] * (len(self.before) - len(meta.shape)) + list(meta.shape)
            for at in inserted:
                padded.insert(at, 1)
            shape = tuple(padded)
            stride = _ones_inserted_strides(meta.shape, meta.stride, shape)
            return self._line("view", VIEW, (arg, shape), replace(meta, shape=shape, stride=stride))
        if meta.shape == self.before and meta.is_contiguous():
            shaped = replace(meta, shape=self.after, stride=contiguous_strides(self.after))  # type: ignore[arg-type]
            return self._line("view", VIEW, (arg, self.after), shaped)
        # Leading 1s broadcast anywhere: only the dimensions after them must survive the reshape.
        lead = next((i for i, n in enumerate(meta.shape) if n != 1), len(meta.shape))
        tail = meta.shape[lead:]
        kept = len(tail)
        before, after = self.before[len(self.before) - kept :], self.after[len(self.after) - kept :]
        if kept < len(self.before) and kept <= len(self.after) and before == after:
            if lead == 0:
                return arg
            trimmed = replace(meta, shape=tail, stride=meta.stride[lead:])
            return self._line("view", VIEW, (arg, tail), trimmed)
        self.failed = True
        return arg

    def _line(self, kernel: str, target: str, args: tuple[Arg, ...], meta: TensorMeta) -> Ref:
        value = Value(next(self.names), meta)
        self.lines.append(KernelCall(kernel, args, (), (value,), self.view.node, target))
        return Ref(value.name)


def _inserted_ones(before: tuple[Any, ...], after: tuple[Any, ...]) -> list[int] | None:
    """The positions in `after` of the size-1 dimensions a reshape from `before` inserts, where that is
    all it does (every dimension of `before` kept, in order); else None."""
    positions, i = [], 0
    for at, n in enumerate(after):
        if i < len(before) and n == before[i]:
            i += 1
        elif n == 1:
            positions.append(at)
        else:
            return None
    return positions if i == len(before) and positions else None


def _ones_inserted_strides(shape: tuple[Any, ...], stride: tuple[Any, ...], viewed: tuple[Any, ...]) -> tuple[Any, ...]:
    """The strides ATen's `view` gives `viewed`, which is `shape` with dimensions of size 1 inserted: the
    kept dimensions keep theirs; an inserted one takes the next kept dimension's stride times its size,
    or after the last, that dimension's stride (1 for a 0-d tensor)."""
    out: list[Any] = []
    i = 0
    for n in viewed:
        if i < len(shape) and n == shape[i]:
            out.append(stride[i])
            i += 1
        elif i < len(shape):
            out.append(stride[i] * shape[i])
        else:
            out.append(stride[-1] if stride else 1)
    return tuple(out)
