"""Turn a default as written in a schema (`1`, `[0, 0]`, `None`, `"none"`) into a Python value."""

from __future__ import annotations

import ast
import math

from opgen.spec.model import Type

MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
SCALAR_TYPES = ("Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double", "Bool", "BFloat16")
# native_functions.yaml also writes a few ScalarType defaults in lower case (`ScalarType? dtype=long`).
SCALAR_TYPE_ALIASES = {"long": "Long", "int": "Int", "float": "Float", "double": "Double", "bool": "Bool"}

DefaultValue = int | float | bool | str | None | list[int] | list[float]


def parse_default(type_: Type, text: str) -> DefaultValue:
    """Return the Python value of `text` as a default of `type_`, or raise ValueError saying why."""
    if text == "None":
        if not (type_.optional or (type_.is_list and type_.elem_optional)):
            raise ValueError(f"default None needs an optional type ('{type_}?')")
        return None
    if type_.is_list:
        return _parse_list(type_, text)
    return _parse_scalar(type_.base, text)


def _parse_list(type_: Type, text: str) -> list[int] | list[float]:
    if type_.base not in ("int", "SymInt", "float"):
        raise ValueError(f"a '{type_}' argument can only default to None")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"default '{text}' is not a list literal") from None
    if isinstance(value, int | float) and not isinstance(value, bool) and type_.size:
        value = [value] * type_.size
    if not isinstance(value, list):
        raise ValueError(f"default '{text}' is not a list")
    elem = Type(type_.base)
    return [_parse_scalar(elem.base, repr(v)) for v in value]  # type: ignore[return-value]


def _parse_scalar(base: str, text: str) -> DefaultValue:
    match base:
        case "int" | "SymInt":
            if text.lstrip("-").isdigit():
                return int(text)
        case "float":
            if text in ("inf", "-inf"):
                return math.copysign(math.inf, -1.0 if text.startswith("-") else 1.0)
            try:
                return float(text)
            except ValueError:
                pass
        case "bool":
            if text in ("True", "False"):
                return text == "True"
        case "Scalar":
            if text in ("True", "False"):
                return text == "True"
            try:
                return int(text) if text.lstrip("-").isdigit() else float(text)
            except ValueError:
                pass
        case "str":
            if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
                return text[1:-1]
        case "MemoryFormat":
            if text in MEMORY_FORMATS:
                return text
        case "ScalarType":
            if text in SCALAR_TYPES:
                return text
            if text in SCALAR_TYPE_ALIASES:
                return SCALAR_TYPE_ALIASES[text]
    raise ValueError(f"default '{text}' is not a valid {base}")
