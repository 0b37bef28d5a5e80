"""The local names generated code binds besides the graph's values, shared by lowering (which renames
inputs and constants around them) and every backend (which binds them).

A torch op called by the runtime (an ATen fallback, or a `py:` Python function) and a non-literal
value (dtype, device, ...) each get one local; these functions say which.
"""

from __future__ import annotations

import builtins
import keyword
import re

from opgen.runtime.ir import Sym

# Names generated code binds besides kernels; inputs and constants are renamed around them.
RESERVED = frozenset(
    {*keyword.kwlist, *dir(builtins), "torch", "make", "forward", "kernel_ops", "constants", "symbols", "rt"}
    | {"cpu", "cuda", "meta", "inf", "neg_inf", "nan", "strided", "sparse_coo"}
    | {"contiguous_format", "channels_last", "channels_last_3d", "preserve_format"}
    | {"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool", "complex64"}
)
RESERVED_PREFIXES = ("_", "buf", "slot", "fold", "packed", "aten_", "mkldnn_", "prims_", "op_")

_FLOAT_NAMES = {"inf": "inf", "-inf": "neg_inf", "nan": "nan"}


def sym_local(sym: Sym) -> str:
    match sym.kind:
        case "device":
            return re.sub(r"\W", "", sym.value)
        case "float":
            return _FLOAT_NAMES[sym.value]
    return sym.value


def fallback_local(target: str) -> str:
    """The local a torch op is bound to: `aten.sort.default` -> `aten_sort`, `py:_operator.mul` -> `op_operator_mul`."""
    if target.startswith("py:"):
        return "op_" + re.sub(r"\W+", "_", target[3:]).strip("_")
    namespace, name, overload = [*target.split("."), "default"][:3]
    parts = [namespace, name.strip("_")] + ([] if overload == "default" else [overload])
    return re.sub(r"\W", "_", "_".join(parts))
