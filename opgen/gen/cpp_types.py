"""Translate schema arguments into the C++ that converts, defaults and passes them.

Each function here is small and pure, with a unit test; the binding emitter only assembles them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from opgen.spec.defaults import parse_default
from opgen.spec.model import Arg, Kernel, OpSpec, Type

# C++ names a schema argument cannot use as a local variable as they stand.
_RESERVED = frozenset(
    "sig slots devices args nargs kwnames module and or not xor bool char int float double "
    "long short signed unsigned void auto const default delete new operator template this "
    "class struct union enum register return switch case break continue do while for if else "
    "goto sizeof static extern friend inline virtual public private protected typename using "
    "namespace try catch throw true false nullptr".split()
)

_SCALAR_CPP = {
    "int": "int64_t",
    "SymInt": "int64_t",
    "float": "double",
    "bool": "bool",
    "Scalar": "at::Scalar",
    "str": "std::string",
    "ScalarType": "at::ScalarType",
    "Layout": "at::Layout",
    "Device": "at::Device",
    "MemoryFormat": "at::MemoryFormat",
}

_MEMORY_FORMAT_CPP = {
    "contiguous_format": "at::MemoryFormat::Contiguous",
    "preserve_format": "at::MemoryFormat::Preserve",
    "channels_last": "at::MemoryFormat::ChannelsLast",
    "channels_last_3d": "at::MemoryFormat::ChannelsLast3d",
}

# Element types a list may hold, and the C++ container each converts into.
LIST_CPP = {
    "Tensor": "std::vector<at::Tensor>",
    "int": "std::vector<int64_t>",
    "SymInt": "std::vector<int64_t>",
    "float": "std::vector<double>",
}


@dataclass(frozen=True, slots=True)
class CppArg:
    """How one argument travels from its Python slot into the kernel call."""

    var: str  # the C++ local's name
    decl: str  # the local's declared type
    convert: str  # expression converting `slots[i]`
    default: str | None  # expression used when the argument is missing; None: required
    pass_expr: str  # expression handed to the kernel


def cpp_var(name: str) -> str:
    return name + "_" if name in _RESERVED else name


def value_type(type_: Type) -> str:
    """The C++ type an argument converts into (before any adaptation for the kernel)."""
    if type_.base == "Tensor":
        if type_.is_list:
            return "c10::List<std::optional<at::Tensor>>" if type_.elem_optional else LIST_CPP["Tensor"]
        return "std::optional<at::Tensor>" if type_.optional else "at::Tensor"
    if type_.is_list and type_.base == "bool":
        inner = f"std::array<bool, {type_.size}>"
    else:
        inner = LIST_CPP[type_.base] if type_.is_list else _SCALAR_CPP[type_.base]
    return f"std::optional<{inner}>" if type_.optional else inner


def convert_expr(arg: Arg, index: int) -> str:
    slot, type_ = f"slots[{index}]", arg.type
    tail = f"({slot}, sig, {index})"
    if type_.base == "Tensor" and not type_.is_list:
        if type_.optional:
            return f"opgen::convert_optional<at::Tensor>{tail}"
        is_written = arg.alias is not None and arg.alias.is_write
        return f"opgen::{'mutable_tensor' if is_written else 'tensor'}{tail}"
    if type_.is_list and type_.base in ("int", "SymInt"):
        func = "optional_int_list" if type_.optional else "int_list"
        return f"opgen::{func}({slot}, sig, {index}, {type_.size or 0})"
    if type_.is_list and type_.base == "bool" and not type_.optional:
        return f"opgen::bool_array<{type_.size}>({slot}, sig, {index})"
    if type_.optional:
        return f"opgen::convert_optional<{value_type(Type(type_.base, False, type_.is_list))}>{tail}"
    return f"opgen::convert<{value_type(type_)}>{tail}"


def decl_type(arg: Arg) -> str:
    type_ = arg.type
    if type_.base == "Tensor" and not type_.is_list and not type_.optional:
        return "at::Tensor&" if arg.alias is not None and arg.alias.is_write else "const at::Tensor&"
    return f"const {value_type(type_)}"


def c_string(text: str) -> str:
    """A C++ string literal: quotes, backslashes, newlines and other control characters escaped."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\{ord(m.group()):03o}", escaped) + '"'


def default_expr(arg: Arg) -> str | None:
    """The C++ value of the schema default, or None for a required argument."""
    if arg.default is None:
        return None
    value = parse_default(arg.type, arg.default)
    if value is None:
        return "std::nullopt" if arg.type.optional else f"{value_type(arg.type)}()"
    return f"{value_type(arg.type)}({_literal(arg.type, value)})"


def _literal(type_: Type, value: object) -> str:
    if isinstance(value, list):
        return "{" + ", ".join(_literal(Type(type_.base), v) for v in value) + "}"
    match type_.base:
        case "bool":
            return "true" if value else "false"
        case "str":
            return c_string(str(value))
        case "MemoryFormat":
            return _MEMORY_FORMAT_CPP[str(value)]
        case "ScalarType":
            return f"at::ScalarType::{value}"
        case "Scalar" if isinstance(value, bool):
            return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<double>::infinity()"
        return repr(value)
    return f"int64_t({value})" if type_.base == "Scalar" else str(value)


def pass_expr(arg: Arg, var: str) -> str:
    """Adapt the local to the kernel's parameter type where the two differ."""
    if arg.type.optional and arg.type.is_list:
        return f"opgen::opt_ref({var})"
    if arg.type.optional and arg.type.base == "str":
        return f"opgen::opt_view({var})"
    return var


def cpp_arg(arg: Arg, index: int) -> CppArg:
    var = cpp_var(arg.name)
    return CppArg(var, decl_type(arg), convert_expr(arg, index), default_expr(arg), pass_expr(arg, var))


def kernel_call_expr(spec: OpSpec, kernel: Kernel) -> str:
    """How a kernel is called from C++ (`at::cpu::add(self, other, alpha)`), with the arguments in the
    locals `cpp_arg` declares: the one place the bindings and the executor's thunks share."""
    args = ", ".join(cpp_arg(a, i).pass_expr for i, a in enumerate(spec.schema.args))
    return f"{kernel.qualified_name}({args})"
