"""Conversions from what an FX graph carries (FakeTensors, torch enums, numbers) to IR data."""

from __future__ import annotations

import math
from typing import Any

import torch

from opgen.runtime.errors import OpgenError
from opgen.runtime.ir import Arg, Ref, Sym, TensorMeta


class DynamicShapeError(OpgenError):
    """The graph has symbolic sizes; opgen compiles static shapes only."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_meta(value: Any, where: str) -> TensorMeta:
    """The static meta of a (fake) tensor; symbolic sizes are an error naming `where`."""
    try:
        shape = tuple(int(s) for s in value.shape)
        stride = tuple(int(s) for s in value.stride())
        offset = int(value.storage_offset())
    except (TypeError, RuntimeError) as exc:  # an unbacked or unhinted SymInt
        raise DynamicShapeError(f"{where}: symbolic sizes are not supported (opgen compiles static shapes)") from exc
    if any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())):
        raise DynamicShapeError(
            f"{where} has symbolic shape {tuple(value.shape)}; opgen compiles static shapes only "
            "(with torch.compile pass dynamic=False)"
        )
    return TensorMeta(shape, stride, dtype_name(value.dtype), str(value.device), offset)


def sym_of(value: Any) -> Sym | None:
    """The IR symbol for a torch enum value, or None if `value` is not one."""
    if isinstance(value, torch.dtype):
        return Sym("dtype", dtype_name(value))
    if isinstance(value, torch.device):
        return Sym("device", str(value))
    if isinstance(value, torch.layout):
        return Sym("layout", str(value).removeprefix("torch."))
    if isinstance(value, torch.memory_format):
        return Sym("memory_format", str(value).removeprefix("torch."))
    if isinstance(value, float) and not math.isfinite(value):
        return Sym("float", repr(value))
    return None


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
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise DynamicShapeError(f"{where}: symbolic value {value} (opgen compiles static shapes)")
    raise OpgenError(f"{where}: cannot pass an argument of type {type(value).__name__} ({value!r})")


def from_sym(sym: Sym) -> Any:
    """The torch object an IR symbol stands for."""
    match sym.kind:
        case "dtype":
            return getattr(torch, sym.value)
        case "device":
            return torch.device(sym.value)
        case "layout" | "memory_format":
            return getattr(torch, sym.value)
        case "float":
            return float(sym.value)
    raise ValueError(f"unknown symbol kind {sym.kind!r}")


def is_ref(arg: Arg) -> bool:
    return isinstance(arg, Ref)
