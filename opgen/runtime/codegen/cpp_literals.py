"""How the C++ executor's programs print literal operands (`None`, ints, `'%-escaped strings'`,
`[lists]`, `torch.float32`, `device(cpu)`), and the error the backend raises for what it cannot
print. The executor's parser (csrc/opgen/exec/executor_parse.cpp) reads the same forms back.
"""

from __future__ import annotations

import re

from opgen.runtime.ir import Arg, SizeExpr, Sym

_SAFE = re.compile(r"[A-Za-z0-9_.:\-]")


class CppUnsupported(Exception):
    """A program the C++ backend cannot print yet; the message says what (the pipeline stores it in the artifact)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"not supported by the cpp backend yet: {what}")
        self.what = what


def escape(text: str) -> str:
    """A key or string with no spaces, quotes or `#`: other characters as %XX (UTF-8 bytes)."""
    return "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def sym_text(sym: Sym) -> str:
    match sym.kind:
        case "dtype":
            return f"torch.{sym.value}"
        case "device" | "layout" | "memory_format":
            return f"{sym.kind}({sym.value})"
        case "float":
            return sym.value  # inf, -inf, nan
    raise CppUnsupported(f"the symbol {sym.kind} {sym.value}")


def literal_text(arg: Arg) -> str:
    """A literal operand (no references)."""
    match arg:
        case None:
            return "None"
        case bool():
            return "True" if arg else "False"
        case int():
            return str(arg)
        case float():
            return repr(arg)
        case str():
            return f"'{escape(arg)}'"
        case Sym():
            return sym_text(arg)
        case SizeExpr():
            raise CppUnsupported(f"symbolic size {arg.text}")
        case tuple():
            if any(isinstance(a, tuple) for a in arg):
                raise CppUnsupported(f"a nested list argument {arg!r}")
            if any(isinstance(a, float) for a in arg) and all(type(a) in (int, float) for a in arg):
                arg = tuple(float(a) for a in arg)  # a float list: its ints as floats, as the parser reads them
            return "[" + ",".join(literal_text(a) for a in arg) + "]"
    raise CppUnsupported(f"the argument {arg!r}")
