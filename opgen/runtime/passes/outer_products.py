"""Matrix products over a contraction of one element are outer products: a broadcast multiply.

`bmm(a, b)` with `a` of [B, M, 1] and `b` of [B, 1, N] sums one product per element, so it is
`mul(a, b)`: the same value, rounded once from the same float32 product. transformers' rotary embedding
(5.17, the GPU machine's; 5.24 multiplies) computes its angles as `inv_freq[None, :, None] @
position_ids[:, None, :]` in float32: a `bmm` of [1, D/2, 1] by [1, 1, 1] in every decode step. On CUDA
that is a cuBLAS (cutlass SIMT sgemm) launch of 3.2 us (an H200) which no generated kernel can take in; as
a `mul`, `fusion` makes it part of the kernel that computes the cosines and sines from it. `mm` of [M, 1]
by [1, N] is taken the same way.

Only where both operands and the result have static metas and the result is contiguous (as a product's
is), and ATen's `mul` of these operands returns a contiguous result too (`_mul_keeps_order`), so that every
reader sees the layout the graph recorded.
"""

from __future__ import annotations

from opgen.runtime.ir import KernelCall, Line, Program, Ref, TensorMeta, contiguous_strides
from opgen.runtime.ir.fusible import FLOATS
from opgen.runtime.passes.analysis import rewrite_body
from opgen.runtime.registry import KernelRegistry

PRODUCTS = frozenset({"aten.bmm.default", "aten.mm.default"})
MUL = "aten.mul.Tensor"


def outer_products(program: Program, registry: KernelRegistry) -> Program:
    if "mul" not in registry.by_name:
        return program
    return rewrite_body(program, _as_mul)


def _as_mul(line: Line, metas: dict[str, TensorMeta]) -> Line:
    if not isinstance(line, KernelCall) or line.target not in PRODUCTS or line.fallback or line.mutates:
        return line
    if len(line.args) != 2 or line.kwargs or len(line.outputs) != 1 or line.outputs[0] is None:
        return line
    a, b = line.args
    out = line.outputs[0].meta
    left = metas.get(a.name) if isinstance(a, Ref) else None
    right = metas.get(b.name) if isinstance(b, Ref) else None
    if left is None or right is None or out is None or not all(m.is_static for m in (left, right, out)):
        return line
    if left.shape[-1] != 1 or left.dtype != right.dtype or left.dtype not in FLOATS:
        return line
    if out.stride != contiguous_strides(out.shape) or not _mul_keeps_order(left, right, out.shape):  # type: ignore[arg-type]
        return line
    return KernelCall("mul", (a, b), (), line.outputs, line.node, MUL, pointwise=True)


def _mul_keeps_order(left: TensorMeta, right: TensorMeta, shape: tuple[int, ...]) -> bool:
    """Whether ATen's `mul` of tensors laid out as `left` and `right`, broadcast to `shape`, returns a
    contiguous result. TensorIterator (`reorder_dimensions`) sorts the dimensions, innermost first, by the
    operands' strides (a broadcast one, stride 0, has no say): a dimension moves inside another where an
    operand's stride along it is the larger, or equal along a longer dimension. Unless a move is made it
    allocates a contiguous result. Operands of the result's own shape, both contiguous, skip the sort
    (`compute_fast_setup_type`) for a contiguous result."""
    if left.shape == right.shape == shape and left.is_contiguous() and right.is_contiguous():
        return True
    operands = [_broadcast_strides(m, shape) for m in (left, right)]

    def should_swap(d0: int, d1: int) -> int:
        for strides in operands:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(range(len(shape))))
    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            swap = should_swap(perm[d0], perm[d1])
            if swap > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif swap < 0:
                break
    return perm == list(reversed(range(len(shape))))


def _broadcast_strides(meta: TensorMeta, shape: tuple[int, ...]) -> list[int]:
    """The operand's strides over `shape` (right-aligned): 0 along a dimension it broadcasts."""
    lead = len(shape) - len(meta.shape)
    own = [
        0 if n == 1 and shape[lead + i] != 1 else s
        for i, (n, s) in enumerate(zip(meta.shape, meta.stride, strict=True))
    ]
    return [0] * lead + own  # type: ignore[list-item]
