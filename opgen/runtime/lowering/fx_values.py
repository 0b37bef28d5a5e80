"""Conversions from what an FX graph carries (FakeTensors, torch enums, numbers) to IR data."""

from __future__ import annotations

from typing import Any

import torch

from opgen.runtime.errors import OpgenError
from opgen.runtime.ir import Arg, Ref, TensorMeta
from opgen.runtime.lowering.symbolic import DynamicShapeError, size_of
from opgen.runtime.torch_symbols import dtype_name, sym_of

__all__ = ["DynamicShapeError", "is_ref", "tensor_meta", "to_arg"]


def tensor_meta(value: Any, where: str) -> TensorMeta:
    """The meta of a (fake) tensor; symbolic sizes become `SizeExpr`s, data-dependent ones an error naming `where`."""
    shape = tuple(size_of(s, where) for s in value.shape)
    stride = tuple(size_of(s, where) for s in value.stride())
    offset = size_of(value.storage_offset(), where)
    return TensorMeta(shape, stride, dtype_name(value.dtype), str(value.device), offset)


def to_arg(value: Any, names: dict[str, Arg], where: str) -> Arg:
    """An FX argument as IR data; `names` maps FX node names to the IR arguments standing for them."""
    if isinstance(value, torch.fx.Node):
        return names[value.name]
    if isinstance(value, list | tuple):
        return tuple(to_arg(v, names, where) for v in value)
    sym = sym_of(value)
    if sym is not None:
        return sym
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.SymInt):
        return size_of(value, where)
    if isinstance(value, torch.SymFloat | torch.SymBool):
        raise DynamicShapeError(f"{where}: symbolic {type(value).__name__} {value} (opgen computes integer sizes only)")
    raise OpgenError(f"{where}: cannot pass an argument of type {type(value).__name__} ({value!r})")


def is_ref(arg: Arg) -> bool:
    return isinstance(arg, Ref)
