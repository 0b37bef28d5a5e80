"""The input check at the top of a compiled function, and the diagnosis when it fails.

The fast check compares every input's dtype, device, sizes, strides and requires_grad with what
the program was compiled for, in one C++ call: torch's `TensorGuards` (the tensor comparator
behind Dynamo's guards, used here on its own, with no frame evaluation). It costs about 150 ns
for two inputs, where reading `x.shape`, `x.dtype` and `x.device` from Python costs about 170 ns
per input. Where that class is missing, an equivalent Python check is used.

A failed check goes to the slow path: `diagnose` says whether the inputs are wrong (a clear
TypeError/ValueError naming the input), or only need another specialization (new sizes or
strides), or fit after all (the check was built under another dispatch state, e.g. outside
`inference_mode`), in which case the check is rebuilt from these inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opgen.runtime.errors import InputMismatchError, InputTypeError, RequiresGradError
from opgen.runtime.fx_values import dtype_name
from opgen.runtime.ir import Input

TensorGuards: Any
try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # pragma: no cover - depends on the torch build
    TensorGuards = None


class _Proceed:
    def __repr__(self) -> str:
        return "PROCEED"


PROCEED = _Proceed()  # the slow path's answer: the inputs fit, run this specialization

Check = Callable[..., bool]


@dataclass(frozen=True, slots=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str

    @classmethod
    def of(cls, i: Input) -> InputSpec:
        return cls(i.name, i.meta.shape, i.meta.stride, i.meta.dtype, i.meta.device)


def never(*args: Any) -> bool:
    """The check before the first call: the slow path builds the real one from real inputs."""
    return False


def fast_check(specs: Sequence[InputSpec], tensors: Sequence[torch.Tensor]) -> Check:
    """A C++ check of `tensors`' metadata (as of now) against the specs.

    TensorGuards refuses a tensor passed twice (Dynamo proves inputs distinct before using it); for
    such calls the Python check takes over.
    """
    if TensorGuards is None or len({id(t) for t in tensors}) < len(tensors):
        return python_check(specs)
    sizes = [list(s.shape) for s in specs]
    strides = [list(s.stride) for s in specs]
    return TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check  # type: ignore[no-any-return]


def python_check(specs: Sequence[InputSpec]) -> Check:
    expected = [(torch.Size(s.shape), s.stride, getattr(torch, s.dtype), torch.device(s.device)) for s in specs]

    def check(*tensors: Any) -> bool:
        for t, (shape, stride, dtype, device) in zip(tensors, expected, strict=True):
            if type(t) is not torch.Tensor or t.shape != shape or t.dtype is not dtype or t.device != device:
                return False
            if t.stride() != stride or t.requires_grad:
                return False
        return True

    return check


def _describe(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)}{list(t.shape)} on {t.device}"


def diagnose(specs: Sequence[InputSpec], args: Sequence[Any]) -> bool:
    """Raise for inputs the program cannot take; True if only sizes/strides differ, False if all fit."""
    new_shapes = False
    for position, (spec, value) in enumerate(zip(specs, args, strict=True), start=1):
        where = f"input '{spec.name}' (position {position})"
        if not isinstance(value, torch.Tensor):
            raise InputTypeError(f"{where} must be a torch.Tensor, got {type(value).__name__}")
        if value.layout != torch.strided:
            raise InputTypeError(f"{where} must be a dense (strided) tensor, got layout {value.layout}")
        if dtype_name(value.dtype) != spec.dtype:
            raise InputTypeError(f"{where}: expected dtype torch.{spec.dtype}, got {value.dtype} ({_describe(value)})")
        if str(value.device) != spec.device:
            raise InputMismatchError(
                f"{where}: expected a tensor on {spec.device}, got one on {value.device} ({_describe(value)})"
            )
        if value.dim() != len(spec.shape):
            expected = f"a {len(spec.shape)}-d tensor of shape {spec.shape}"
            raise InputMismatchError(f"{where}: expected {expected}, got {value.dim()}-d {tuple(value.shape)}")
        if value.requires_grad and torch.is_grad_enabled():
            raise RequiresGradError(where)
        new_shapes |= tuple(value.shape) != spec.shape or tuple(value.stride()) != spec.stride
    return new_shapes


def shape_mismatch_message(specs: Sequence[InputSpec], args: Sequence[torch.Tensor]) -> str:
    for position, (spec, value) in enumerate(zip(specs, args, strict=True), start=1):
        if tuple(value.shape) != spec.shape or tuple(value.stride()) != spec.stride:
            compiled = f"compiled for shape {spec.shape} with strides {spec.stride}"
            got = f"got shape {tuple(value.shape)} with strides {tuple(value.stride())}"
            return f"input '{spec.name}' (position {position}): {compiled}, {got}"
    return "inputs differ from the compiled ones"


def signature(args: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], ...]:
    """The key of a specialization: what the compiled code depends on."""
    return tuple((tuple(a.shape), tuple(a.stride()), a.dtype, str(a.device)) for a in args)
