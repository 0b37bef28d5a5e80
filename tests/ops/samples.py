"""Sample inputs for every op group that kernel_ops binds, keyed by the functional op's aten name.

An op group (`add`, `add_`, `add_out`) shares one entry: `test_ops_eager.py` calls the functional
op with a sample's arguments, the in-place variant with the same arguments, and the out variant with
them plus `out=`. In-place-only ops (`copy_`, `fill_`, `zero_`) have entries of their own.

A builder takes a `Maker` (one dtype, a fixed seed) and returns its samples. It is called once per
side (kernel_ops, eager), so both sides get equal but separate tensors with equal strides. Keep
tensors small: the whole file runs hundreds of cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

F32, F64, F16, I64, BOOL = torch.float32, torch.float64, torch.float16, torch.int64, torch.bool
FLOAT = (F32, F64)
FLOAT_INT = (F32, I64)
NUMERIC = (F32, F64, I64)
LOGICAL = (F32, BOOL)
CL = torch.channels_last
CPU = MappingProxyType({"layout": torch.strided, "device": "cpu", "pin_memory": False})
VARIANTS = frozenset({"functional", "inplace", "out"})


@dataclass(frozen=True, slots=True)
class Sample:
    """One call's arguments; `variants` limits it to some of its group's functions."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    variants: frozenset[str] = VARIANTS

    def only(self, *variants: str) -> Sample:
        return dataclasses.replace(self, variants=frozenset(variants))

    def applies_to(self, variant: str) -> bool:
        return variant in self.variants

    def __repr__(self) -> str:
        shown = [*map(_show, self.args), *(f"{k}={_show(v)}" for k, v in self.kwargs.items())]
        return f"S({', '.join(shown)})"


def _show(x: Any) -> str:
    """Tensors as `float32[3, 4]` plus their oddities, so that failures read well."""
    if isinstance(x, torch.Tensor):
        odd = {"strided": not x.is_contiguous(), "neg": x.is_neg(), "conj": x.is_conj()}
        notes = "".join(f" {k}" for k, v in odd.items() if v)
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}{notes}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(map(_show, x)) + "]"
    return repr(x)


def S(*args: Any, **kwargs: Any) -> Sample:
    return Sample(args, kwargs)


class Maker:
    """Makes the tensors of one op's samples: values of `dtype` from a fixed seed."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._gen = torch.Generator().manual_seed(0)

    def __call__(
        self, *shape: int, dtype: torch.dtype | None = None, low: float = -3, high: float = 3, nonzero: bool = False
    ) -> torch.Tensor:
        dtype = dtype or self.dtype
        if dtype == BOOL:
            return torch.randint(0, 2, shape, generator=self._gen).bool()
        if dtype.is_floating_point:
            t = torch.empty(shape, dtype=F64).uniform_(low, high, generator=self._gen).to(dtype)
        else:
            t = torch.randint(int(low), int(high) + 1, shape, generator=self._gen, dtype=dtype)
        return torch.where(t == 0, torch.ones((), dtype=dtype), t) if nonzero else t

    def small(self, *shape: int) -> torch.Tensor:
        """Integers in [-2, 2] as `dtype`: ties and equal elements are likely."""
        return self(*shape, dtype=I64, low=-2, high=2).to(self.dtype)

    def index(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self._gen)

    def mask(self, *shape: int) -> torch.Tensor:
        return self(*shape, dtype=BOOL)

    def num(self, value: float) -> float | int | bool:
        """`value` as a Python number of the kind that matches `dtype`."""
        if self.dtype == BOOL:
            return bool(value)
        return value if self.dtype.is_floating_point else int(value)

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point


Builder = Callable[[Maker], list[Sample]]


@dataclass(frozen=True, slots=True)
class OpSamples:
    """The samples of one op group and the dtypes they run in; `values=False`: meta only.

    `values_of`: for ops returning a tuple, the results whose values are compared; the others are
    compared as metadata only (fused attention's RNG state is uninitialized memory without dropout).
    """

    dtypes: tuple[torch.dtype, ...]
    builder: Builder
    values: bool = True
    values_of: tuple[int, ...] | None = None

    def build(self, dtype: torch.dtype) -> list[Sample]:
        return self.builder(Maker(dtype))


# int[N] lists that ATen accepts but the binding rejects (int_list's length check in binding.cpp).


# --- builders by op family ------------------------------------------------------------------------
def _unary(low: float = -3, high: float = 3, **kwargs: Any) -> Builder:
    def build(m: Maker) -> list[Sample]:
        return [
            S(m(3, 4, low=low, high=high), **kwargs),
            S(m(4, 3, low=low, high=high).t(), **kwargs),  # non-contiguous
            S(m(2, 0), **kwargs),  # empty
            S(m(low=low, high=high), **kwargs),  # 0-dim
        ]

    return build


def _unary_with(*extra: dict[str, Any], low: float = -3, high: float = 3) -> Builder:
    """Unary samples with default arguments, plus one 3x4 sample per `extra` kwargs."""

    def build(m: Maker) -> list[Sample]:
        return _unary(low, high)(m) + [S(m(3, 4, low=low, high=high), **kw) for kw in extra]

    return build


def _binary(nonzero: bool = False, **kwargs: Any) -> Builder:
    """Two tensors; `self` always has the full result shape, so the in-place variant applies."""

    def build(m: Maker) -> list[Sample]:
        return [
            S(m(3, 4), m(3, 4, nonzero=nonzero), **kwargs),
            S(m(3, 4), m(4, nonzero=nonzero), **kwargs),  # broadcast other
            S(m(4, 3).t(), m(3, 4, nonzero=nonzero), **kwargs),  # non-contiguous self
            S(m(2, 3), m(nonzero=nonzero), **kwargs),  # 0-dim other
        ]

    return build


def _add_like(m: Maker) -> list[Sample]:
    return [*_binary()(m), S(m(3, 4), m(3, 4), alpha=m.num(2)), *_promoting(m)]


def _promoting(m: Maker) -> list[Sample]:
    """Mixed dtypes: the result type is the promoted one, so only functional and out apply."""
    wider = F32 if m.dtype == F64 else F64
    return [
        S(m(3, 4), m(3, 4, dtype=wider)).only("functional", "out"),
        S(m(3, 4), torch.tensor(2.5, dtype=wider)).only("functional", "out"),  # 0-dim: no promotion
    ]


def _scalar_add_like(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m.num(2.5)), S(m(4, 3).t(), m.num(-1), m.num(3)), S(m(), m.num(1.5), alpha=m.num(2))]


def _scalar_binary(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m.num(2.5)), S(m(4, 3).t(), m.num(-2)), S(m(), 2)]


def _div_mode(m: Maker) -> list[Sample]:
    true_div = S(m(3, 4), m(3, 4, nonzero=True), rounding_mode=None)
    return [
        *_binary(nonzero=True, rounding_mode="trunc")(m),
        S(m(3, 4), m(4, nonzero=True), rounding_mode="floor"),
        true_div if m.is_float else true_div.only("functional", "out"),  # int / int is float
    ]


def _pow(m: Maker) -> list[Sample]:
    base = 0.1 if m.is_float else -3  # lowest base; integer exponents must not be negative
    exp = -2 if m.is_float else 0
    return [
        S(m(3, 4, low=base), m(3, 4, low=exp)),
        S(m(3, 4, low=base), m(4, low=exp)),
        S(m(4, 3, low=base).t(), m(low=exp)),
    ]


def _pow_scalar(m: Maker) -> list[Sample]:
    exps = (2, 0.5, -1.0, 3) if m.is_float else (2, 3, 0)
    return [S(m(3, 4, low=0.1 if m.is_float else -3), e) for e in exps] + [S(m(4, 3).t(), 2)]


def _min_max(m: Maker) -> list[Sample]:
    samples = _binary()(m)
    if m.is_float:
        a = m(3, 4)
        a[0, 0] = float("nan")
        samples.append(S(a, m(3, 4)))
    return samples


def _compare(m: Maker) -> list[Sample]:
    return [S(m.small(3, 4), m.small(3, 4)), S(m.small(3, 4), m.small(4)), S(m.small(4, 3).t(), m.small(3, 4))]


def _compare_scalar(m: Maker) -> list[Sample]:
    return [S(m.small(3, 4), m.num(1)), S(m.small(4, 3).t(), 0), S(m.small(3, 4), other=m.num(-1.0))]


def _logical_not(m: Maker) -> list[Sample]:
    return [S(m.small(3, 4)), S(m.small(4, 3).t()), S(m.small())]


# --- elementwise: clamp, where, masked_fill ------------------------------------------------------
def _where(m: Maker) -> list[Sample]:
    return [
        S(m.mask(3, 4), m(3, 4), m(3, 4)),
        S(m.mask(3, 1), m(3, 4), m(4)),
        S(m.mask(3, 4), m(4, 3).t(), m()),
    ]


def _clamp(m: Maker) -> list[Sample]:
    lo, hi = m.num(-1.5), m.num(1.5)
    return [
        S(m(3, 4), lo, hi),
        S(m(4, 3).t(), lo),
        S(m(3, 4), None, hi),
        S(m(3, 4), max=hi),
        S(m(3, 4), min=lo, max=hi),
        S(m(3, 4), -1.5, 1.5).only("functional", "out"),  # float bounds promote an int tensor
    ]


def _clamp_tensor(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), m(3, 4, low=-3, high=0), m(3, 4, low=0, high=3)),
        S(m(3, 4), m(4), None),
        S(m(4, 3).t(), None, m()),
        S(m(3, 4), min=m(4)),
        S(m(3, 4), max=m(3, 4)),
    ]


def _masked_fill(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), m.mask(3, 4), m.num(1.5)),
        S(m(3, 4), m.mask(4), m.num(-2)),
        S(m(4, 3).t(), m.mask(3, 4), 0),
    ]


# --- reductions -----------------------------------------------------------------------------------
def _sum(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(4, 3).t()), S(m(3, 4), dtype=F64), S(m(2, 0))]


def _sum_dim(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), [1]),
        S(m(3, 4), 1),
        S(m(2, 3, 4), [0, 2], True),
        S(m(3, 4), None),
        S(m(4, 3).t(), dim=[-1], keepdim=True),
        S(m(3, 4), [0], dtype=F64),
        S(m(3, 4), []),  # all dims
    ]


def _mean(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), [1]),
        S(m(3, 4), -1, True),
        S(m(2, 3, 4), [0, 2]),
        S(m(3, 4), None),
        S(m(3, 4), [0], dtype=F64),
        S(m(3, 4), []),
    ]


def _amax(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(3, 4), [1]), S(m(2, 3, 4), [0, 2], True), S(m(4, 3).t(), -1)]


def _arg_reduce(m: Maker) -> list[Sample]:
    return [S(m.small(3, 4)), S(m.small(3, 4), 1), S(m.small(3, 4), 0, True), S(m.small(4, 3).t(), dim=-1)]


def _max_dim(m: Maker) -> list[Sample]:
    return [S(m.small(3, 4), 1), S(m.small(2, 3, 4), 0, True), S(m.small(4, 3).t(), dim=-1)]


def _prod(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4, low=-2, high=2), 1),
        S(m(3, 4, low=-2, high=2), 0, True),
        S(m(3, 4, low=-2, high=2), 1, dtype=F64),
    ]


def _var(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4)),
        S(m(3, 4), [1]),
        S(m(3, 4), 1, correction=0, keepdim=True),
        S(m(2, 3, 4), [0, 2], correction=2),
    ]


def _cumsum(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 0), S(m(3, 4), -1), S(m(4, 3).t(), 1), S(m(3, 4), 1, dtype=F64)]


def _any_all(m: Maker) -> list[Sample]:
    return [S(m.small(3, 4), 1), S(m.small(3, 4), 0, True), S(m(2, 3, 4), -1)]


def _softmax_core(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 1, False), S(m(2, 3, 4), 0, False), S(m(4, 3).t(), -1, False)]


def _softmax(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 1), S(m(2, 3, 4), -1), S(m(4, 3).t(), 0, F64), S(m(3, 4), dim=1, dtype=F64)]


# --- views and shapes -----------------------------------------------------------------------------
def _view(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), [4, 3]),
        S(m(3, 4), [-1]),
        S(m(2, 3, 4), (6, -1)),
        S(m(4, 3).t(), [3, 2, 2]),
        S(m(3, 4), torch.Size([2, 6])),
    ]


def _reshape(m: Maker) -> list[Sample]:
    return [S(m(3, 4), [4, 3]), S(m(4, 3).t(), [-1]), S(m(4, 3).t(), [3, 2, 2]), S(m(), [1, 1])]


def _permute(m: Maker) -> list[Sample]:
    return [S(m(2, 3, 4), [2, 0, 1]), S(m(2, 3, 4), [-1, 1, 0]), S(m(3, 4), [1, 0])]


def _transpose(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 0, 1), S(m(2, 3, 4), -1, 0), S(m(3, 4), 1, 1)]


def _t(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(4)), S(m(4, 3).t())]


def _expand(m: Maker) -> list[Sample]:
    return [
        S(m(3, 1), [3, 4]),
        S(m(3, 4), [2, 3, 4]),
        S(m(3, 1), [-1, 4]),
        S(m(3, 1), [3, 4], implicit=True),
        S(m(3, 1), torch.Size([3, 4])),
    ]


def _squeeze_dim(m: Maker) -> list[Sample]:
    return [S(m(3, 1, 4), 1), S(m(3, 1, 4), 0), S(m(3, 4, 1), -1)]


def _squeeze_dims(m: Maker) -> list[Sample]:
    return [S(m(1, 3, 1, 4), [0, 2]), S(m(3, 4), []), S(m(1, 3, 1), [0, 1, 2])]


def _unsqueeze(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 0), S(m(3, 4), -1), S(m(4, 3).t(), 1)]


def _slice(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4)),
        S(m(3, 4), 1, 1, 3),
        S(m(5, 4), 0, None, None, 2),
        S(m(3, 4), 1, -3, None),
        S(m(3, 4), 0, 1, 100),
        S(m(3, 4), dim=1, start=0, end=4, step=3),
    ]


def _select(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 0, 1), S(m(3, 4), 1, -1), S(m(2, 3, 4), 2, 0)]


def _narrow(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 0, 1, 2), S(m(3, 4), 1, 0, 4), S(m(3, 4), -1, 2, 1)]


def _alias(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(4, 3).t())]


def _flatten(m: Maker) -> list[Sample]:
    return [S(m(2, 3, 4)), S(m(2, 3, 4), 1), S(m(2, 3, 4), 0, 1), S(m(4, 3).t()), S(m())]


def _cat(m: Maker) -> list[Sample]:
    return [
        S([m(2, 3), m(4, 3)]),
        S([m(3, 2), m(3, 1), m(3, 0)], 1),
        S([m(2, 3)], -1),
        S([m(2, 3), m(0), m(1, 3)]),  # 1-d empty tensors are skipped
        S((m(2, 3), m(3, 4).t()[:2]), dim=0),
    ]


def _stack(m: Maker) -> list[Sample]:
    return [S([m(2, 3), m(2, 3)]), S([m(2, 3), m(2, 3), m(3, 2).t()], 2), S((m(3),), -1)]


def _split(m: Maker) -> list[Sample]:
    return [S(m(5, 4), 2), S(m(5, 4), 3, 1), S(m(4, 3), 4), S(m(4, 5).t(), split_size=2, dim=-1)]


def _split_with_sizes(m: Maker) -> list[Sample]:
    return [S(m(5, 4), [2, 3]), S(m(5, 4), [1, 1, 2], 1), S(m(5, 4), [5, 0])]


def _unbind(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(3, 4), 1), S(m(2, 3, 4), -1)]


def _clone(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4)),
        S(m(4, 3).t()),  # preserve_format keeps the strides
        S(m(2, 3, 4, 5), memory_format=CL),
        S(m(4, 3).t(), memory_format=torch.contiguous_format),
    ]


def _contiguous(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(4, 3).t()), S(m(2, 3, 4, 5), memory_format=CL)]


def _to_copy(m: Maker) -> list[Sample]:
    other = F64 if m.dtype != F64 else F32
    return [
        S(m(3, 4)),
        S(m(3, 4), dtype=other),
        S(m(4, 3).t()),
        S(m(2, 3, 4, 5), memory_format=CL),
        S(m(3, 4), dtype=torch.int32, device=torch.device("cpu"), non_blocking=False),
        S(m(3, 4), **CPU),
    ]


def _copy_(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), m(3, 4)),
        S(m(3, 4), m(4)),
        S(m(3, 4), m(3, 4, dtype=torch.int32)),
        S(m(4, 3).t(), m(3, 4), False),
    ]


def _fill_(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m.num(2.5)), S(m(4, 3).t(), 0), S(m(), value=m.num(-1))]


def _zero_(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(4, 3).t()), S(m(2, 0))]


# --- matmul ---------------------------------------------------------------------------------------
def _mm(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m(4, 5)), S(m(4, 3).t(), m(4, 5)), S(m(3, 0), m(0, 2))]


def _bmm(m: Maker) -> list[Sample]:
    return [S(m(2, 3, 4), m(2, 4, 5)), S(m(2, 4, 3).transpose(1, 2), m(2, 4, 5))]


def _addmm(m: Maker) -> list[Sample]:
    return [
        S(m(3, 5), m(3, 4), m(4, 5)),
        S(m(5), m(3, 4), m(4, 5), beta=0.5, alpha=2.0),
        S(m(3, 5), m(4, 3).t(), m(4, 5), beta=0),
    ]


def _baddbmm(m: Maker) -> list[Sample]:
    return [S(m(2, 3, 5), m(2, 3, 4), m(2, 4, 5)), S(m(5), m(2, 3, 4), m(2, 4, 5), beta=0.5, alpha=2.0)]


def _matmul(m: Maker) -> list[Sample]:
    return [
        S(m(4), m(4)),
        S(m(3, 4), m(4)),
        S(m(4), m(4, 5)),
        S(m(2, 3, 4), m(4, 5)),
        S(m(2, 3, 4), m(1, 4, 5)),
    ]


def _linear(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m(5, 4), m(5)), S(m(2, 3, 4), m(5, 4)), S(m(3, 4), m(5, 4), None)]


# --- normalization --------------------------------------------------------------------------------
def _native_layer_norm(m: Maker) -> list[Sample]:
    return [S(m(2, 3, 4), [4], m(4), m(4), 1e-5), S(m(2, 3, 4), [3, 4], None, None, 1e-3)]


def _layer_norm(m: Maker) -> list[Sample]:
    return [
        S(m(2, 3, 4), [4]),
        S(m(2, 3, 4), [3, 4], m(3, 4), m(3, 4), 1e-3),
        S(m(3, 4), [4], weight=m(4), cudnn_enable=False),
    ]


def _batch_norm(m: Maker) -> list[Sample]:
    return [
        S(m(2, 3, 4, 4), m(3), m(3), m(3), m(3, low=0.5), 0.1, 1e-5),
        S(m(2, 3, 5), None, None, m(3), m(3, low=0.5), 0.1, 1e-3),
    ]


def _group_norm(m: Maker) -> list[Sample]:
    return [S(m(2, 6, 3, 3), m(6), m(6), 2, 6, 9, 3, 1e-5), S(m(2, 4, 5), None, None, 2, 4, 5, 2, 1e-3)]


# --- pooling and convolution ----------------------------------------------------------------------
def _max_pool2d(m: Maker) -> list[Sample]:
    return [
        S(m(1, 2, 6, 6), [2, 2]),
        S(m(2, 3, 7, 7), 3, 2, 1),
        S(m(1, 2, 7, 7), [3, 3], [2, 2], [1, 1], [2, 2], True),
        S(m(2, 6, 6), [2, 2]),
        S(m(1, 2, 6, 6), [2, 2], []),
        S(m(1, 2, 6, 6), [2, 2], [2], [1]),
    ]


def _avg_pool2d(m: Maker) -> list[Sample]:
    return [
        S(m(1, 2, 6, 6), [2, 2]),
        S(m(2, 3, 7, 7), 3, 2, 1),
        S(m(1, 2, 7, 7), [3, 3], [2, 2], [1, 1], True, False),
        S(m(1, 2, 6, 6), [2, 2], divisor_override=3),
        S(m(1, 2, 6, 6), [2, 2], []),
    ]


def _adaptive_pool(m: Maker) -> list[Sample]:
    return [S(m(1, 2, 6, 6), [3, 3]), S(m(2, 3, 7, 5), [2, 4]), S(m(2, 7, 5), [1, 1])]


def _convolution(m: Maker) -> list[Sample]:
    return [
        S(m(1, 4, 6, 6), m(6, 4, 3, 3), m(6), [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
        S(m(2, 4, 7, 7), m(4, 2, 3, 3), None, [2, 2], [1, 1], [2, 2], False, [0, 0], 2),
        S(m(1, 4, 5, 5), m(4, 3, 3, 3), m(3), [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
        S(m(2, 3, 8), m(4, 3, 3), m(4), [1], [1], [1], False, [0], 1),
    ]


def _conv2d(m: Maker) -> list[Sample]:
    return [
        S(m(1, 4, 6, 6), m(6, 4, 3, 3)),
        S(m(1, 4, 6, 6), m(6, 4, 3, 3), m(6), [2, 2], [1, 1]),
        S(m(1, 4, 7, 7), m(4, 2, 3, 3), None, [1, 2], [1, 0], [2, 1], 2),
        S(m(1, 4, 6, 6), m(6, 4, 3, 3), stride=[1]),
    ]


def _cudnn_conv_relu(m: Maker) -> list[Sample]:
    return [
        S(m(1, 4, 6, 6), m(6, 4, 3, 3), m(6), [1, 1], [1, 1], [1, 1], 1),
        S(m(2, 4, 7, 7), m(4, 2, 3, 3), None, [2, 2], [0, 0], [2, 2], 2),
        S(m(1, 4, 6, 6).to(memory_format=CL), m(6, 4, 3, 3).to(memory_format=CL), m(6), [1, 1], [1, 1], [1, 1], 1),
    ]


def _cudnn_conv_add_relu(m: Maker) -> list[Sample]:
    return [
        S(m(1, 4, 6, 6), m(6, 4, 3, 3), m(1, 6, 6, 6), 1.0, m(6), [1, 1], [1, 1], [1, 1], 1),
        S(m(2, 4, 7, 7), m(4, 4, 3, 3), m(2, 4, 3, 3), 0.5, None, [2, 2], [0, 0], [1, 1], 1),
        S(m(1, 4, 6, 6).to(memory_format=CL), m(6, 4, 3, 3).to(memory_format=CL),
          m(1, 6, 6, 6).to(memory_format=CL), None, m(6), [1, 1], [1, 1], [1, 1], 1),
    ]  # fmt: skip


# --- embedding and indexing -----------------------------------------------------------------------
def _embedding(m: Maker) -> list[Sample]:
    return [
        S(m(10, 3), m.index(10, 2, 4)),
        S(m(10, 3), m.index(10, 5), 0),
        S(m(10, 3), m.index(10, 3), padding_idx=-1, scale_grad_by_freq=False, sparse=False),
        S(m(10, 3), m.index(10, 2, 2).int()),
    ]


def _index_select(m: Maker) -> list[Sample]:
    return [
        S(m(5, 4), 0, m.index(5, 3)),
        S(m(5, 4), 1, m.index(4, 6)),
        S(m(4, 5).t(), -1, m.index(4, 0)),
        S(m(5, 4), 0, m.index(5, 3).int()),
    ]


def _index(m: Maker) -> list[Sample]:
    return [
        S(m(5, 4), [m.index(5, 3)]),
        S(m(5, 4), [None, m.index(4, 2)]),
        S(m(5, 4), [m.index(5, 2, 1), m.index(4, 3)]),
        S(m(5, 4), [m.mask(5, 4)]),
        S(m(4, 5).t(), (m.index(5, 3),)),
        S(m(5, 4), [m.index(5, 3).int(), None]),
    ]


def _gather(m: Maker) -> list[Sample]:
    return [
        S(m(3, 4), 1, m.index(4, 3, 2)),
        S(m(3, 4), 0, m.index(3, 2, 4)),
        S(m(4, 3).t(), 1, m.index(4, 3, 5), sparse_grad=False),
    ]


def _scatter(m: Maker) -> list[Sample]:
    return [S(m(3, 4), 1, m.index(4, 3, 2), m.num(2.5)), S(m(4, 3).t(), 0, m.index(3, 1, 4), m.num(-1))]


def _masked_select(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m.mask(3, 4)), S(m(3, 4), m.mask(4)), S(m(4, 3).t(), m.mask(3, 4))]


# --- creation -------------------------------------------------------------------------------------
def _zeros(m: Maker) -> list[Sample]:
    return [S([2, 3], dtype=m.dtype), S((4,), dtype=m.dtype, **CPU), S([2, 0, 3], dtype=m.dtype), S([2, 3])]


def _full(m: Maker) -> list[Sample]:
    return [S([2, 3], m.num(1.5), dtype=m.dtype), S([2], 7), S([2], True), S([2, 2], 2.5, **CPU), S((), m.num(-1))]


def _empty(m: Maker) -> list[Sample]:
    return [S([2, 3], dtype=m.dtype), S([2, 3, 4, 5], dtype=m.dtype, memory_format=CL), S([0]), S((3,), **CPU)]


def _empty_permuted(m: Maker) -> list[Sample]:
    return [
        S([2, 3], [0, 1], dtype=m.dtype),
        S([2, 3, 4, 5], [0, 2, 3, 1], dtype=m.dtype),
        S([0], [0]),
        S((3,), (0,), **CPU),
    ]


def _arange(m: Maker) -> list[Sample]:
    return [
        S(0, 10, 3, dtype=m.dtype),
        S(0, 5),
        S(5, 0, -1, dtype=m.dtype),
        S(0.5, 3.0, 0.25),
        S(m.num(1), m.num(8), m.num(2), **CPU),
    ]


def _scalar_tensor(m: Maker) -> list[Sample]:
    return [S(m.num(2.5), dtype=m.dtype), S(3), S(1.5, **CPU)]


def _like(m: Maker) -> list[Sample]:
    return [S(m(3, 4)), S(m(3, 4), dtype=F64), S(m(4, 3).t(), **CPU), S(m(2, 3, 4, 5), memory_format=CL)]


def _full_like(m: Maker) -> list[Sample]:
    return [S(m(3, 4), m.num(2.5)), S(m(4, 3).t(), 1, dtype=F64, **CPU), S(m(2, 3, 4, 5), 0, memory_format=CL)]


def _tril(m: Maker) -> list[Sample]:
    return [S(m(4, 5)), S(m(4, 5), 1), S(m(2, 4, 3), -1), S(m(5, 4).t(), diagonal=2)]


SAMPLES: Mapping[str, OpSamples] = MappingProxyType(
    {
        # elementwise arithmetic
        "add.Tensor": OpSamples(NUMERIC, _add_like),
        "add.Scalar": OpSamples(NUMERIC, _scalar_add_like),
        "sub.Tensor": OpSamples(NUMERIC, _add_like),
        "mul.Tensor": OpSamples((*NUMERIC, BOOL), _binary()),
        "mul.Scalar": OpSamples(NUMERIC, _scalar_binary),
        "div.Tensor": OpSamples(FLOAT, _binary(nonzero=True)),
        "div.Tensor_mode": OpSamples(NUMERIC, _div_mode),
        "div.Scalar": OpSamples(FLOAT, _scalar_binary),
        "remainder.Tensor": OpSamples(NUMERIC, _binary(nonzero=True)),
        "pow.Tensor_Tensor": OpSamples(NUMERIC, _pow),
        "pow.Tensor_Scalar": OpSamples(NUMERIC, _pow_scalar),
        "maximum": OpSamples(FLOAT_INT, _min_max),
        "minimum": OpSamples(FLOAT_INT, _min_max),
        "rsub.Tensor": OpSamples(NUMERIC, _add_like),
        # comparisons and logical
        **{f"{op}.Tensor": OpSamples(FLOAT_INT, _compare) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
        **{f"{op}.Scalar": OpSamples(FLOAT_INT, _compare_scalar) for op in ("eq", "ne", "lt", "gt")},
        "logical_and": OpSamples(LOGICAL, _compare),
        "logical_or": OpSamples(LOGICAL, _compare),
        "logical_not": OpSamples(LOGICAL, _logical_not),
        "bitwise_not": OpSamples((I64, BOOL), _unary()),  # not defined for floating types
        "bitwise_and.Tensor": OpSamples((I64, BOOL), _binary()),
        # unary math
        "neg": OpSamples(NUMERIC, _unary()),
        "abs": OpSamples(NUMERIC, _unary()),
        "sign": OpSamples(NUMERIC, _unary()),
        **{op: OpSamples(FLOAT, _unary()) for op in ("exp", "sin", "cos", "tanh", "sigmoid", "erf", "expm1")},
        **{op: OpSamples(FLOAT, _unary()) for op in ("floor", "ceil", "round")},
        **{op: OpSamples(FLOAT, _unary(low=0.1)) for op in ("log", "sqrt", "rsqrt", "reciprocal")},
        "log1p": OpSamples(FLOAT, _unary(low=-0.9)),
        # activations
        "relu": OpSamples(NUMERIC, _unary()),
        "gelu": OpSamples(FLOAT, _unary_with({"approximate": "tanh"}, {"approximate": "none"})),
        "silu": OpSamples(FLOAT, _unary()),
        "hardtanh": OpSamples(FLOAT, _unary_with({"min_val": -0.5, "max_val": 2.0})),
        "leaky_relu": OpSamples(FLOAT, _unary_with({"negative_slope": 0.2})),
        "elu": OpSamples(FLOAT, _unary_with({"alpha": 0.5, "scale": 2.0, "input_scale": 1.5})),
        "softplus": OpSamples(FLOAT, _unary_with({"beta": 2.0, "threshold": 1.0})),
        "hardsigmoid": OpSamples(FLOAT, _unary()),
        "hardswish": OpSamples(FLOAT, _unary()),
        "where.self": OpSamples(FLOAT_INT, _where),
        "clamp": OpSamples(FLOAT_INT, _clamp),
        "clamp.Tensor": OpSamples(FLOAT_INT, _clamp_tensor),
        "masked_fill.Scalar": OpSamples((F32, I64, BOOL), _masked_fill),
        # reductions
        "sum": OpSamples(FLOAT_INT, _sum),
        "sum.dim_IntList": OpSamples(FLOAT_INT, _sum_dim),
        "mean.dim": OpSamples(FLOAT, _mean),
        "amax": OpSamples(FLOAT_INT, _amax),
        "amin": OpSamples(FLOAT_INT, _amax),
        "argmax": OpSamples(FLOAT_INT, _arg_reduce),
        "argmin": OpSamples(FLOAT_INT, _arg_reduce),
        "max.dim": OpSamples(FLOAT_INT, _max_dim),
        "min.dim": OpSamples(FLOAT_INT, _max_dim),
        "prod.dim_int": OpSamples(FLOAT_INT, _prod),
        "var.correction": OpSamples(FLOAT, _var),
        "cumsum": OpSamples(FLOAT_INT, _cumsum),
        "any.dim": OpSamples(LOGICAL, _any_all),
        "all.dim": OpSamples(LOGICAL, _any_all),
        "_softmax": OpSamples(FLOAT, _softmax_core),
        "_log_softmax": OpSamples(FLOAT, _softmax_core),
        "softmax.int": OpSamples(FLOAT, _softmax),
        "log_softmax.int": OpSamples(FLOAT, _softmax),
        # views and shapes
        "view": OpSamples(FLOAT_INT, _view),
        "reshape": OpSamples(FLOAT_INT, _reshape),
        "_unsafe_view": OpSamples(FLOAT_INT, _view),
        "permute": OpSamples(FLOAT_INT, _permute),
        "transpose.int": OpSamples(FLOAT_INT, _transpose),
        "t": OpSamples(FLOAT_INT, _t),
        "expand": OpSamples(FLOAT_INT, _expand),
        "squeeze.dim": OpSamples(FLOAT_INT, _squeeze_dim),
        "squeeze.dims": OpSamples(FLOAT_INT, _squeeze_dims),
        "unsqueeze": OpSamples(FLOAT_INT, _unsqueeze),
        "slice.Tensor": OpSamples(FLOAT_INT, _slice),
        "select.int": OpSamples(FLOAT_INT, _select),
        "narrow": OpSamples(FLOAT_INT, _narrow),
        "alias": OpSamples(FLOAT_INT, _alias),
        "flatten.using_ints": OpSamples(FLOAT_INT, _flatten),
        "cat": OpSamples(FLOAT_INT, _cat),
        "stack": OpSamples(FLOAT_INT, _stack),
        "split.Tensor": OpSamples(FLOAT_INT, _split),
        "split_with_sizes": OpSamples(FLOAT_INT, _split_with_sizes),
        "unbind.int": OpSamples(FLOAT_INT, _unbind),
        "clone": OpSamples(FLOAT_INT, _clone),
        "contiguous": OpSamples(FLOAT_INT, _contiguous),
        "_to_copy": OpSamples(NUMERIC, _to_copy),
        "copy_": OpSamples(FLOAT_INT, _copy_),
        "fill_.Scalar": OpSamples((F32, I64, BOOL), _fill_),
        "zero_": OpSamples(FLOAT_INT, _zero_),
        # matmul
        "mm": OpSamples(FLOAT, _mm),
        "bmm": OpSamples(FLOAT, _bmm),
        "addmm": OpSamples(FLOAT, _addmm),
        "baddbmm": OpSamples(FLOAT, _baddbmm),
        "matmul": OpSamples(FLOAT, _matmul),
        "linear": OpSamples(FLOAT, _linear),
        # normalization
        "native_layer_norm": OpSamples(FLOAT, _native_layer_norm),
        "layer_norm": OpSamples(FLOAT, _layer_norm),
        "_native_batch_norm_legit_no_training": OpSamples(FLOAT, _batch_norm),
        "native_group_norm": OpSamples(FLOAT, _group_norm),
        # pooling and convolution
        "max_pool2d_with_indices": OpSamples(FLOAT, _max_pool2d),
        "avg_pool2d": OpSamples(FLOAT, _avg_pool2d),
        "_adaptive_avg_pool2d": OpSamples(FLOAT, _adaptive_pool),
        "adaptive_avg_pool2d": OpSamples(FLOAT, _adaptive_pool),
        "convolution": OpSamples(FLOAT, _convolution),
        "conv2d": OpSamples(FLOAT, _conv2d),
        "cudnn_convolution_relu": OpSamples((F32, F16), _cudnn_conv_relu),
        "cudnn_convolution_add_relu": OpSamples((F32, F16), _cudnn_conv_add_relu),
        # embedding and indexing
        "embedding": OpSamples(FLOAT_INT, _embedding),
        "index_select": OpSamples(FLOAT_INT, _index_select),
        "index.Tensor": OpSamples(FLOAT_INT, _index),
        "gather": OpSamples(FLOAT_INT, _gather),
        "scatter.value": OpSamples(FLOAT_INT, _scatter),
        "masked_select": OpSamples(FLOAT_INT, _masked_select),
        # creation
        "zeros": OpSamples(FLOAT_INT, _zeros),
        "ones": OpSamples(FLOAT_INT, _zeros),
        "full": OpSamples(FLOAT_INT, _full),
        "empty.memory_format": OpSamples(FLOAT_INT, _empty, values=False),
        "arange.start_step": OpSamples(FLOAT_INT, _arange),
        "scalar_tensor": OpSamples(FLOAT_INT, _scalar_tensor),
        "zeros_like": OpSamples(FLOAT_INT, _like),
        "ones_like": OpSamples(FLOAT_INT, _like),
        "full_like": OpSamples(FLOAT_INT, _full_like),
        "empty_like": OpSamples(FLOAT_INT, _like, values=False),
        "empty_permuted": OpSamples(FLOAT_INT, _empty_permuted, values=False),
        "tril": OpSamples((F32, I64, BOOL), _tril),
        "triu": OpSamples((F32, I64, BOOL), _tril),
        # ops the runtime needs
        "mean": OpSamples(FLOAT, lambda m: [S(m(3, 4)), S(m(3, 4), dtype=F64)]),
        "repeat": OpSamples(FLOAT_INT, lambda m: [S(m(2, 3), [2, 1]), S(m(3), [2, 2])]),
        "lift_fresh_copy": OpSamples(FLOAT_INT, lambda m: [S(m(3, 4))]),
    }
)

# The core-opset entries live in their own module (imported last: it builds on this one's helpers).
from samples_core import CORE_NO_FLOAT32, CORE_SAMPLES  # noqa: E402

assert not set(SAMPLES) & set(CORE_SAMPLES), "an op has samples in both samples.py and samples_core.py"
SAMPLES = MappingProxyType({**SAMPLES, **CORE_SAMPLES})

# Ops that float32 does not apply to; every other entry must run in float32.
NO_FLOAT32 = frozenset({"bitwise_not", "bitwise_and.Tensor"}) | CORE_NO_FLOAT32


# --- opgen's own kernels (`opgen::` in the registry): samples, and the eager function they must match -------
def _mkldnn(op: Any, scalar_lists: tuple[int, ...]) -> Any:
    """torch.ops.mkldnn's overload, with the float tuples kernel_ops takes as the Scalar?[] lists it takes."""

    def eager(*args: Any) -> Any:
        return op(*(list(a) if i in scalar_lists else a for i, a in enumerate(args)))

    return eager


def _linear_samples(m: Maker) -> list[Sample]:
    x, w, b = m(16, 32), m(24, 32), m(24)
    return [
        S(x, w, b, "none", (), ""),
        S(x, w, None, "gelu", (), "tanh"),
        S(m(2, 3, 32), w, b, "leaky_relu", (0.1,), ""),
    ]


def _mkl_linear_samples(m: Maker) -> list[Sample]:
    """A plain weight (a plain product; tests/ops/test_onednn_kernels.py runs packed ones)."""
    x, w, b = m(16, 32), m(24, 32), m(24)
    return [S(x, w, w, b, 16), S(m(2, 3, 32), w, w, None, 6)]


def _conv_samples(m: Maker) -> list[Sample]:
    x, w, b = m(2, 8, 12, 12), m(16, 4, 3, 3), m(16)
    return [
        S(x, w, b, [1, 1], [2, 2], [1, 1], 2, "relu", (), ""),
        S(x, w, None, [0, 0], [1, 1], [2, 2], 2, "hardtanh", (-1.0, 1.0), ""),
    ]


OWN_SAMPLES: Mapping[str, OpSamples] = MappingProxyType(
    {
        "opgen::mkldnn_linear_pointwise": OpSamples((F32,), _linear_samples),
        "opgen::mkldnn_linear_pointwise_binary": OpSamples(
            (F32,), lambda m: [S(m(16, 32), m(16, 24), m(24, 32), m(24), "add")]
        ),
        "opgen::mkldnn_convolution_pointwise": OpSamples((F32,), _conv_samples),
        "opgen::mkl_linear": OpSamples((F32,), _mkl_linear_samples),
        "opgen::mkldnn_convolution_pointwise_binary": OpSamples(
            (F32,),
            lambda m: [
                S(
                    m(2, 8, 12, 12),
                    m(2, 16, 6, 6),
                    m(16, 4, 3, 3),
                    m(16),
                    [1, 1],
                    [2, 2],
                    [1, 1],
                    2,
                    "add",
                    1.0,
                    "relu",
                    (),
                    "",
                )
            ],
        ),
    }
)
# where the eager result comes from for a function whose registry `aten` is not an ATen op
EAGER: Mapping[str, Any] = MappingProxyType(
    {
        "opgen::mkldnn_linear_pointwise": _mkldnn(torch.ops.mkldnn._linear_pointwise.default, (4,)),
        "opgen::mkldnn_linear_pointwise_binary": _mkldnn(torch.ops.mkldnn._linear_pointwise.binary, ()),
        "opgen::mkldnn_convolution_pointwise": _mkldnn(torch.ops.mkldnn._convolution_pointwise.default, (8,)),
        "opgen::mkldnn_convolution_pointwise_binary": _mkldnn(torch.ops.mkldnn._convolution_pointwise.binary, (11,)),
        **({"opgen::mkl_linear": torch.ops.mkl._mkl_linear.default} if torch.backends.mkl.is_available() else {}),
    }
    if hasattr(torch.ops.mkldnn, "_convolution_pointwise")
    else {}
)
SAMPLES = MappingProxyType({**SAMPLES, **{k: v for k, v in OWN_SAMPLES.items() if k in EAGER}})
