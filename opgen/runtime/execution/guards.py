"""The input check at the top of a compiled function, and the diagnosis when it fails.

The fast check compares every input's exact type (a plain torch.Tensor), dtype, device, sizes,
strides (but of dimensions of size 1, which never step) and requires_grad with what the program
was compiled for, in one vectorcall into the extension (`opgen._C.InputCheck`, about 60 ns for two
inputs; reading `x.shape`, `x.dtype` and `x.device` from Python costs about 170 ns per input).

A failed check goes to the slow path: `diagnose` says whether the inputs are wrong (a clear
TypeError/ValueError naming the input), or only need another specialization (new sizes or
strides), or fit after all (the first call, before any check exists; or an input that requires
grad while grad mode is off), in which case the check is rebuilt from the specs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from opgen._C import InputCheck
from opgen.runtime.artifact.compiled import InputSpec
from opgen.runtime.errors import InputMismatchError, InputTypeError, RequiresGradError
from opgen.runtime.torch_symbols import dtype_name


class _Proceed:
    def __repr__(self) -> str:
        return "PROCEED"


PROCEED = _Proceed()  # the slow path's answer: the inputs fit, run this specialization

Check = Callable[..., bool]


def never(*args: Any) -> bool:
    """The check before the first call: the slow path builds the real one from real inputs."""
    return False


def fast_check(specs: Sequence[InputSpec]) -> Check:
    """The C++ check of tensors' metadata against the specs."""
    expected = [(getattr(torch, s.dtype), torch.device(s.device), s.shape, s.stride) for s in specs]
    return InputCheck(expected)  # type: ignore[no-any-return]


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
        new_shapes |= tuple(value.shape) != spec.shape or not same_strides(value, spec.shape, spec.stride)
    return new_shapes


def stride_key(shape: Sequence[Any], stride: Sequence[Any]) -> tuple[Any, ...]:
    """The strides that matter: None for dimensions of size 1 (they never step: any stride does)."""
    return tuple(None if n == 1 else s for n, s in zip(shape, stride, strict=True))


def same_strides(t: torch.Tensor, shape: Sequence[Any], stride: Sequence[Any]) -> bool:
    """`t` (of `shape`) has the strides `stride`, but for dimensions of size 1."""
    return stride_key(shape, t.stride()) == stride_key(shape, stride)


def shape_mismatch_message(specs: Sequence[InputSpec], args: Sequence[torch.Tensor]) -> str:
    for position, (spec, value) in enumerate(zip(specs, args, strict=True), start=1):
        if tuple(value.shape) != spec.shape or not same_strides(value, spec.shape, spec.stride):
            compiled = f"compiled for shape {spec.shape} with strides {spec.stride}"
            got = f"got shape {tuple(value.shape)} with strides {tuple(value.stride())}"
            return f"input '{spec.name}' (position {position}): {compiled}, {got}"
    return "inputs differ from the compiled ones"


def signature(args: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], ...]:
    """The key of a specialization: what the compiled code depends on (not the strides of size-1 dimensions)."""
    return tuple((tuple(a.shape), stride_key(a.shape, a.stride()), a.dtype, str(a.device)) for a in args)
