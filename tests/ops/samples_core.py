"""Samples for the core-opset section of ops.yaml and the fused ops beyond it (issue 9).

Same format as `samples.py` (which merges these into `SAMPLES`): one entry per op group, keyed
by the functional op's aten name. Backward ops get their saved tensors from the forward op, so the
values they see are those autograd would pass.
"""

from __future__ import annotations

from typing import Any

import torch
from samples import BOOL, F16, F32, F64, FLOAT, FLOAT_INT, I64, LOGICAL, Builder, Maker, OpSamples, S, Sample

aten = torch.ops.aten
INT_BOOL = (I64, BOOL)
HALF = (F16, torch.bfloat16)


def _unary(low: float = -3, high: float = 3) -> Builder:
    def build(m: Maker) -> list[Sample]:
        return [
            S(m(3, 4, low=low, high=high)),
            S(m(4, 3, low=low, high=high).t()),
            S(m(2, 0)),
            S(m(low=low, high=high)),
        ]

    return build


def _binary(nonzero: bool = False) -> Builder:
    def build(m: Maker) -> list[Sample]:
        return [
            S(m(3, 4), m(3, 4, nonzero=nonzero)),
            S(m(3, 4), m(4, nonzero=nonzero)),
            S(m(4, 3).t(), m(3, 4, nonzero=nonzero)),
        ]

    return build


def _scalar(value: float, **kwargs: Any) -> Builder:
    return lambda m: [
        S(m(3, 4), m.num(value), **kwargs),
        S(m(4, 3).t(), m.num(value), **kwargs),
        S(m(), m.num(value), **kwargs),
    ]


def _pow_scalar_base(m: Maker) -> list[Sample]:
    return [S(m.num(2), m(3, 4, low=0)), S(m.num(3), m(4, 3, low=0).t())]


def _sdpa(m: Maker) -> list[Sample]:
    q, k, v = (m(1, 2, 5, 8) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    return [
        S(q, k, v),
        S(m(1, 2, 5, 8), m(1, 2, 5, 8), m(1, 2, 5, 8), is_causal=True),
        S(m(2, 4, 5, 8), m(2, 4, 7, 8), m(2, 4, 7, 8), scale=0.5),
        S(m(1, 2, 5, 8), m(1, 2, 5, 8), m(1, 2, 5, 8), mask),
        S(m(1, 2, 5, 8), m(1, 2, 5, 8), m(1, 2, 5, 8), m(5, 5)),  # additive float mask
        S(m(1, 4, 5, 8), m(1, 2, 5, 8), m(1, 2, 5, 8), enable_gqa=True),
    ]


def _flash_cpu(m: Maker) -> list[Sample]:
    return [S(m(1, 2, 5, 8), m(1, 2, 5, 8), m(1, 2, 5, 8)), S(m(1, 2, 5, 8), m(1, 2, 5, 8), m(1, 2, 5, 8), 0.0, True)]


# The fused CUDA attention kernels, called directly as torch.compile's graphs call them: they check
# less than scaled_dot_product_attention, so each sample fits its kernel (head_dim a multiple of 8;
# an attn_bias of query's dtype, as the composite makes it from a bool or float mask, with rows of
# 16 keys: aligned; broadcast over the heads by a stride-0 view for the memory-efficient kernel, by
# a head dimension of 1 for cuDNN, as the composite passes them). `_hf` makes the layout Hugging
# Face's attention makes ([B, S, H, D] transposed). GQA (fewer key/value heads) where the kernel
# supports it: flash and cuDNN (torch 2.11's memory-efficient kernel does not). Their other results
# are uninitialized without dropout or when not asked for: `values_of` compares only what they compute.
def _hf(m: Maker, b: int, h: int, s: int, d: int) -> torch.Tensor:
    return m(b, s, h, d).transpose(1, 2)


def _flash_cuda(m: Maker) -> list[Sample]:
    return [
        S(m(1, 2, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16)),
        S(m(1, 2, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), 0.0, True),
        S(m(2, 4, 5, 16), m(2, 4, 7, 16), m(2, 4, 7, 16), scale=0.5),
        S(m(1, 4, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), is_causal=True),  # GQA
        S(_hf(m, 1, 4, 5, 16), _hf(m, 1, 4, 5, 16), _hf(m, 1, 4, 5, 16), 0.0, True),
        S(m(1, 32, 1, 64), m(1, 32, 33, 64), m(1, 32, 33, 64)),  # decode: one query token
        S(m(1, 32, 1, 64), m(1, 8, 33, 64), m(1, 8, 33, 64)),  # decode, GQA
    ]


def _bias(m: Maker, b: int, h: int, s: int, n: int) -> torch.Tensor:
    """An additive mask broadcast over the heads, as the composite passes it to the fused kernels."""
    return m(b, 1, s, n).expand(b, h, s, n)


def _efficient_cuda(m: Maker) -> list[Sample]:
    return [
        S(m(1, 2, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), None, False),
        S(m(1, 2, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), None, True, 0.0, True),
        S(m(2, 4, 5, 16), m(2, 4, 16, 16), m(2, 4, 16, 16), m(2, 4, 5, 16), False, scale=0.5),
        S(_hf(m, 1, 2, 5, 16), _hf(m, 1, 2, 16, 16), _hf(m, 1, 2, 16, 16), _bias(m, 1, 2, 5, 16), True),
        S(m(1, 32, 1, 64), m(1, 32, 32, 64), m(1, 32, 32, 64), _bias(m, 1, 32, 1, 32), False),  # decode
    ]


def _cudnn_cuda(m: Maker) -> list[Sample]:
    return [
        S(m(1, 2, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), None, False),
        S(m(1, 2, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), None, True, 0.0, True),
        S(m(2, 4, 5, 16), m(2, 4, 16, 16), m(2, 4, 16, 16), m(2, 4, 5, 16), False, scale=0.5),
        S(_hf(m, 1, 2, 5, 16), _hf(m, 1, 2, 16, 16), _hf(m, 1, 2, 16, 16), m(1, 1, 5, 16), False),
        S(m(1, 4, 5, 16), m(1, 2, 5, 16), m(1, 2, 5, 16), None, False, 0.0, True),  # GQA
        S(m(1, 32, 1, 64), m(1, 32, 33, 64), m(1, 32, 33, 64), None, False),  # decode: one query token
        S(m(1, 32, 1, 64), m(1, 32, 32, 64), m(1, 32, 32, 64), m(1, 1, 1, 32), False),  # decode, mask
        S(m(1, 32, 1, 64), m(1, 8, 33, 64), m(1, 8, 33, 64), None, False),  # decode, GQA
    ]


def _batch_norm_legit(m: Maker) -> list[Sample]:
    return [
        S(m(2, 3, 4), m(3), m(3), m(3), m(3, low=0.5), True, 0.1, 1e-5).only(
            "functional"
        ),  # check_out runs the op once more for its templates, updating the stats twice
        S(m(2, 3, 2, 2), None, None, m(3), m(3, low=0.5), False, 0.1, 1e-5),
    ]


def _scatter_index() -> torch.Tensor:
    return torch.tensor([[0, 1], [2, 3], [1, 0]])


def _scatter(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 1, _scatter_index(), m(3, 2)), S(m(4, 3), 0, torch.tensor([[0, 1, 2], [3, 2, 1]]), m(2, 3))]


def _scatter_reduce(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), 1, _scatter_index(), m(3, 2), "sum"),
        S(m(3, 4), 1, _scatter_index(), m(3, 2), "amax", include_self=False),
    ]


def _index_put(m: Maker) -> list[Sample]:
    rows = torch.tensor([0, 3])
    return [
        S(m(5, 3), [rows], m(2, 3)),
        S(m(5, 3), [rows, torch.tensor([1, 2])], m(2), True),
        S(m(5, 3), [None, torch.tensor([2])], m(5, 1)),
    ]


def _embedding_bag(m: Maker) -> list[Sample]:
    indices, offsets = torch.tensor([0, 2, 1, 4, 3]), torch.tensor([0, 2])
    return [S(m(5, 3), indices, offsets), S(m(5, 3), indices, offsets, False, 1)]


def _native_dropout(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 0.5, False), S(m(3, 4), 0.0, True)]


def _fft_c2r(m: Maker) -> list[Sample]:
    return [S(torch.complex(m(3, 5), m(3, 5)), [1], 0, 8), S(torch.complex(m(4, 3), m(4, 3)), [0, 1], 2, 4)]


def _pads(*shapes_and_pads: tuple[tuple[int, ...], list[int]]) -> Builder:
    return lambda m: [S(m(*shape), pad) for shape, pad in shapes_and_pads]


CORE_SAMPLES: dict[str, OpSamples] = {
    # element-wise
    **{
        name: OpSamples(FLOAT, _unary())
        for name in ("asinh", "atan", "cosh", "sinh", "trunc", "mish", "isinf", "isnan")
    },
    **{name: OpSamples(FLOAT, _unary(-0.9, 0.9)) for name in ("acos", "asin", "atanh")},
    "acosh": OpSamples(FLOAT, _unary(1.1, 3)),
    "tan": OpSamples(FLOAT, _unary(-1, 1)),
    "log10": OpSamples(FLOAT, _unary(0.1, 3)),
    "log2": OpSamples(FLOAT, _unary(0.1, 3)),
    "atan2": OpSamples(FLOAT, _binary()),
    "fmod.Tensor": OpSamples(FLOAT_INT, _binary(nonzero=True)),
    "fmod.Scalar": OpSamples(FLOAT_INT, _scalar(2.5)),
    "remainder.Scalar": OpSamples(FLOAT_INT, _scalar(2.5)),
    "div.Scalar_mode": OpSamples(FLOAT, _scalar(2.5, rounding_mode="floor")),
    "sub.Scalar": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), m.num(2.5)), S(m(4, 3).t(), m.num(1), m.num(2))]),
    "pow.Scalar": OpSamples(FLOAT_INT, _pow_scalar_base),
    "ge.Scalar": OpSamples(FLOAT_INT, _scalar(0.5)),
    "le.Scalar": OpSamples(FLOAT_INT, _scalar(0.5)),
    "bitwise_and.Scalar": OpSamples(INT_BOOL, _scalar(3)),
    "bitwise_or.Scalar": OpSamples(INT_BOOL, _scalar(3)),
    "bitwise_xor.Scalar": OpSamples(INT_BOOL, _scalar(3)),
    "bitwise_or.Tensor": OpSamples(INT_BOOL, _binary()),
    "bitwise_xor.Tensor": OpSamples(INT_BOOL, _binary()),
    "logical_xor": OpSamples(LOGICAL, _binary()),
    "addcmul": OpSamples(FLOAT, lambda m: [S(m(3, 4), m(3, 4), m(4)), S(m(3, 4), m(3, 4), m(3, 4), value=0.5)]),
    "copy": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), m(3, 4)), S(m(3, 4), m(4))]),
    "fill.Scalar": OpSamples(FLOAT_INT, _scalar(2)),
    # reductions, sorting
    "any": OpSamples(LOGICAL, lambda m: [S(m(3, 4)), S(m(2, 0))]),
    "any.dims": OpSamples(LOGICAL, lambda m: [S(m(3, 4), [0, 1]), S(m(3, 4), [1], True), S(m(3, 4))]),
    "prod": OpSamples(FLOAT_INT, lambda m: [S(m.small(3, 4)), S(m.small(2, 3), dtype=F64)]),
    "var.dim": OpSamples(FLOAT, lambda m: [S(m(3, 4), [1]), S(m(3, 4), None, False, True)]),
    "sort": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4)), S(m(3, 4), 0, True)]),
    "topk": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), 2), S(m(3, 4), 1, 0, False)]),
    "nonzero": OpSamples(FLOAT_INT, lambda m: [S(m.small(3, 4)), S(m(2, 0))]),
    # views, copies, scatters
    "as_strided": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), [2, 2], [1, 2]), S(m(3, 4), [2], [3], 1)]),
    "diagonal": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4)), S(m(3, 4), 1), S(m(2, 3, 4), 0, 1, 2)]),
    "flip": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), [0]), S(m(3, 4), [0, 1])]),
    "roll": OpSamples(
        FLOAT_INT,
        lambda m: [S(m(3, 4), [1], [0]), S(m(2, 5, 4), [-2, 7], [1, 2]), S(m(3, 4), [5]), S(m(4, 3).t(), [1], [-1])],
    ),
    "select_scatter": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), m(4), 0, 1), S(m(3, 4), m(3), 1, -1)]),
    "slice_scatter": OpSamples(FLOAT_INT, lambda m: [S(m(4, 3), m(2, 3), 0, 1, 3), S(m(3, 4), m(3, 2), 1, 0, 4, 2)]),
    "scatter.src": OpSamples(FLOAT_INT, _scatter),
    "scatter_add": OpSamples(FLOAT_INT, _scatter),
    "scatter_reduce.two": OpSamples(FLOAT_INT, _scatter_reduce),
    "index_put": OpSamples(FLOAT_INT, _index_put),
    "masked_scatter": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), m.mask(3, 4), m(12)), S(m(3, 4), m.mask(4), m(12))]),
    "constant_pad_nd": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4), [1, 2]), S(m(2, 3, 4), [1, 1, 0, 2], m.num(1.5))]),
    "reflection_pad1d": OpSamples(FLOAT, _pads(((2, 5), [1, 2]))),
    "reflection_pad2d": OpSamples(FLOAT, _pads(((1, 3, 4), [1, 1, 2, 0]))),
    "reflection_pad3d": OpSamples(FLOAT, _pads(((1, 3, 3, 3), [1, 1, 1, 1, 1, 1]))),
    "replication_pad2d": OpSamples(FLOAT, _pads(((1, 3, 4), [1, 1, 2, 0]))),
    "replication_pad3d": OpSamples(FLOAT, _pads(((1, 3, 3, 3), [1, 1, 1, 1, 1, 1]))),
    "adaptive_avg_pool1d": OpSamples(FLOAT, lambda m: [S(m(2, 3, 8), [4]), S(m(3, 7), [3])]),
    "avg_pool1d": OpSamples(FLOAT, lambda m: [S(m(2, 3, 8), [2]), S(m(2, 3, 8), [3], [1], [1])]),
    "resize_": OpSamples(
        FLOAT_INT,
        lambda m: [
            S(m(3, 4), [2, 3]),
            S(m(3, 4), [12]),
            S(m(2, 3, 2, 2), [1, 3, 2, 2], memory_format=torch.channels_last),
        ],
    ),
    "col2im": OpSamples(FLOAT, lambda m: [S(m(1, 8, 9), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1])]),
    # creation (random or uninitialized: metadata only)
    "empty_strided": OpSamples(
        FLOAT_INT, lambda m: [S([2, 3], [3, 1], dtype=m.dtype), S([2, 3], [1, 2], dtype=m.dtype)], values=False
    ),
    "rand": OpSamples(FLOAT, lambda m: [S([2, 3], dtype=m.dtype)], values=False),
    "randn": OpSamples(FLOAT, lambda m: [S([2, 3], dtype=m.dtype)], values=False),
    "randperm": OpSamples(FLOAT_INT, lambda m: [S(5, dtype=m.dtype)], values=False),
    "native_dropout": OpSamples(FLOAT, _native_dropout),
    # normalization, pooling, convolution, attention and their backward ops
    "_native_batch_norm_legit": OpSamples(FLOAT, _batch_norm_legit),
    "_adaptive_avg_pool3d": OpSamples(FLOAT, lambda m: [S(m(1, 2, 4, 4, 4), [2, 2, 2]), S(m(2, 3, 3, 3), [1, 2, 3])]),
    "avg_pool3d": OpSamples(
        FLOAT, lambda m: [S(m(1, 2, 4, 4, 4), [2, 2, 2]), S(m(1, 2, 4, 4, 4), [3, 3, 3], [1, 1, 1], 1)]
    ),
    "max_pool3d_with_indices": OpSamples(FLOAT, lambda m: [S(m(1, 2, 4, 4, 4), [2, 2, 2])]),
    "_embedding_bag": OpSamples(FLOAT, _embedding_bag),
    "grid_sampler_2d": OpSamples(FLOAT, lambda m: [S(m(1, 2, 4, 4), m(1, 3, 3, 2, low=-1, high=1), 0, 0, False)]),
    "upsample_bilinear2d.vec": OpSamples(
        FLOAT, lambda m: [S(m(1, 2, 3, 3), [6, 6], False, None), S(m(1, 2, 3, 3), None, True, [2.0, 2.0])]
    ),
    "upsample_nearest2d.vec": OpSamples(
        FLOAT, lambda m: [S(m(1, 2, 3, 3), [6, 6], None), S(m(1, 2, 3, 3), None, [2.0, 1.5])]
    ),
    "_cdist_forward": OpSamples(
        FLOAT, lambda m: [S(m(3, 4), m(5, 4), 2.0, None), S(m(2, 3, 4), m(2, 5, 4), 1.0, None)]
    ),
    "_pdist_forward": OpSamples(FLOAT, lambda m: [S(m(4, 3)), S(m(4, 3), 1.0)]),
    "_fft_r2c": OpSamples(FLOAT, lambda m: [S(m(3, 8), [1], 0, True), S(m(4, 4), [0, 1], 2, False)]),
    "_fft_c2r": OpSamples(FLOAT, _fft_c2r),
    "scaled_dot_product_attention": OpSamples(FLOAT, _sdpa),
    "_scaled_dot_product_flash_attention_for_cpu": OpSamples(FLOAT, _flash_cpu),
    "_scaled_dot_product_flash_attention": OpSamples(HALF, _flash_cuda, values_of=(0, 1)),
    "_scaled_dot_product_efficient_attention": OpSamples((F32, *HALF), _efficient_cuda, values_of=(0,)),
    "_scaled_dot_product_cudnn_attention": OpSamples(HALF, _cudnn_cuda, values_of=(0,)),
}

# Entries here that float32 does not apply to (bitwise ops on integers and bools).
CORE_NO_FLOAT32 = frozenset(k for k, v in CORE_SAMPLES.items() if F32 not in v.dtypes)
