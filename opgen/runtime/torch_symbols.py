"""Torch's enum-like values and the IR's symbols for them, both ways.

Lowering turns a dtype, device, layout, memory format or non-finite float in a graph into an IR
`Sym` (`sym_of`); the executor turns it back into the torch object when it binds a program
(`from_sym`); input checks and packages name dtypes as the IR does (`dtype_name`). Below both the
lowering and the execution rooms: it imports only the IR.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from opgen.runtime.ir import Sym


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
