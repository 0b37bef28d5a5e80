"""Sizes in the C++ executor's programs (dynamic shapes): a size expression's text as the postfix
program of a `sym` line, and a tensor's shape with `?` for what the runtime's input check binds.

The IR's size expressions are Python text over size symbols with `+ - * ** // %`, `min` and `max`
(`opgen.runtime.ir.sizes`); a `sym` line evaluates the same operators, in postfix order, over the
registers of the symbols (`csrc/opgen/exec/executor.cpp`, Python's floor division and modulo).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from opgen.runtime.ir import TensorMeta

_OPERATORS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}


class SizeTextError(ValueError):
    """A size expression the executor cannot evaluate (the backend says so and stays Python)."""


def postfix(text: str, operand: Callable[[str], str]) -> list[str]:
    """`s77*64 + 1` -> ["r5", "64", "*", "1", "+"]; `operand(name)` is a symbol's register."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise SizeTextError(f"the size expression {text!r}") from exc
    return _walk(tree, operand, text)


def _walk(node: ast.expr, operand: Callable[[str], str], text: str) -> list[str]:
    match node:
        case ast.Constant(value=int() as value) if not isinstance(value, bool):
            return [str(value)]
        case ast.Name(id=name):
            return [operand(name)]
        case ast.UnaryOp(op=ast.USub(), operand=inner):
            return [*_walk(inner, operand, text), "neg"]
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPERATORS:
            return [*_walk(left, operand, text), *_walk(right, operand, text), _OPERATORS[type(op)]]
        case ast.Call(func=ast.Name(id="min" | "max" as fn), args=[first, *rest], keywords=[]) if rest:
            out = _walk(first, operand, text)
            for arg in rest:
                out += [*_walk(arg, operand, text), fn]
            return out
    raise SizeTextError(f"the size expression {text!r} ({ast.unparse(node)})")


def input_shape_text(meta: TensorMeta) -> str:
    """`[?,64] [64,1]`: an input's sizes and strides, `?` where symbolic (the input check binds them)."""

    def items(values: tuple[object, ...]) -> str:
        return "[" + ",".join(str(n) if type(n) is int else "?" for n in values) + "]"

    return f"{items(meta.shape)} {items(meta.stride)}"
