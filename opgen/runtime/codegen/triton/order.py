"""The order a pointwise kernel walks its elements in: its output's memory order.

A pointwise kernel's loads and stores are coalesced where consecutive elements of its flat index are
adjacent in memory. The iteration space is the graph's logical shape (N, C, H, W), which for a
channels-last output (a value of the cudnn pass's region: EfficientNet's bias + SiLU after each
convolution) puts consecutive elements C apart: on the H100 such kernels lost the multi-kernel choice
to ATen's, whose TensorIterator walks memory order. Elementwise results do not depend on the order,
so the kernel walks the output's dimensions by decreasing stride: the space and every tensor's dims
are permuted alike (an operand that broadcasts first gains its leading 1s).

Only the generated kernel sees the permuted group; the graph's values keep their shapes.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import FusedGroup, Step, Tensor, TensorMeta, flat_steps
from opgen.runtime.ir.fusible import CAT


def in_memory_order(group: FusedGroup) -> FusedGroup:
    """`group` with its dims in its first output's memory order (itself where that is the logical order,
    or where the kernel indexes by position: row kernels, cats, placed outputs)."""
    if group.kind != "pointwise" or any(s.target == CAT for s in flat_steps(group.steps)):
        return group
    if any(t.placement is not None for t in group.outputs):
        return group
    out = group.outputs[0].meta
    if out.shape != group.shape:
        return group
    rank = len(group.shape)
    strides = [s if isinstance(s, int) and n != 1 else 0 for n, s in zip(group.shape, out.stride, strict=True)]
    order = tuple(sorted(range(rank), key=lambda d: (-strides[d], d)))
    if order == tuple(range(rank)):
        return group

    def tensor(t: Tensor) -> Tensor:
        return replace(t, meta=_permuted(t.meta, rank, order))

    def step(s: Step) -> Step:
        branches = tuple(tuple(step(b) for b in branch) for branch in s.branches)
        return replace(s, outputs=tuple(None if t is None else tensor(t) for t in s.outputs), branches=branches)

    return replace(
        group,
        shape=tuple(group.shape[d] for d in order),
        inputs=tuple(tensor(t) for t in group.inputs),
        outputs=tuple(tensor(t) for t in group.outputs),
        steps=tuple(step(s) for s in group.steps),
    )


def _permuted(meta: TensorMeta, rank: int, order: tuple[int, ...]) -> TensorMeta:
    """`meta` right-aligned to `rank` dims (leading 1s, stride 0), its dims in `order`."""
    lead = rank - len(meta.shape)
    shape, stride = (1,) * lead + tuple(meta.shape), (0,) * lead + tuple(meta.stride)
    return replace(meta, shape=tuple(shape[d] for d in order), stride=tuple(stride[d] for d in order))
