"""Arithmetic on IR sizes (ints and `SizeExpr`s) through sympy; no torch, like the IR and the passes.

The IR stores a symbolic size as the Python text of a sympy expression over size symbols; this
module prints expressions (the shape environment's own, through `opgen.runtime.lowering.symbolic`, and its
own results) with one printer, so equal sizes get equal texts, turns texts back into expressions
(cached), and computes products and row-major strides. Sizes use `+ - * ** // %`, `min` and `max`;
an expression with any other function is refused (`UnsupportedSize`).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import sympy
from sympy.printing.str import StrPrinter


@dataclass(frozen=True, slots=True)
class SizeExpr:
    """A size known only per call: Python source over size symbols (`s27*s77`), in canonical form.

    Two equal texts are provably equal sizes (the shape environment canonicalises expressions).
    """

    text: str
    symbols: tuple[str, ...]  # the size symbols the text reads


Size = Union[int, SizeExpr]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class SizeRange:
    """The values a size symbol may take, as export or Dynamo recorded them; `high` None: unbounded."""

    symbol: str
    low: int
    high: int | None

    def text(self) -> str:
        return f"[{self.low}, {'inf' if self.high is None else self.high}]"

    def contains(self, value: int) -> bool:
        return self.low <= value and (self.high is None or value <= self.high)


class UnsupportedSize(ValueError):
    """A size expression with a function the printer cannot write as Python."""


class FloorDiv(sympy.Function):
    """Python's `a // b` on sizes (the shape environment has its own class of the same name)."""

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Integer(int(a) // int(b))
        return None


class _Printer(StrPrinter):
    """Python source for a size expression: `//` and `%` as operators, `min`/`max` as builtins."""

    printmethod = "_opgen_size_text"  # dispatch on class names only, not on torch's own `_sympystr`

    def _print_FloorDiv(self, expr: Any) -> str:
        a, b = expr.args
        return f"({self._print(a)} // {self._print(b)})"

    def _print_Mod(self, expr: Any) -> str:
        a, b = expr.args
        return f"({self._print(a)} % {self._print(b)})"

    _print_PythonMod = _print_Mod

    def _print_Min(self, expr: Any) -> str:
        return "min(" + ", ".join(self._print(a) for a in expr.args) + ")"

    def _print_Max(self, expr: Any) -> str:
        return "max(" + ", ".join(self._print(a) for a in expr.args) + ")"


_PRINTER = _Printer()
_FUNCTIONS = frozenset({"FloorDiv", "Mod", "PythonMod", "Min", "Max"})


def symbol(name: str) -> sympy.Symbol:
    """A size symbol: a positive integer, as the shape environment declares backed sizes."""
    return sympy.Symbol(name, integer=True, positive=True)


def from_expr(expr: Any) -> Size:
    """An int for a number, else the canonical `SizeExpr` of a sympy expression.

    Symbols are taken as positive integers (the input check refuses sizes below 1), which lets
    sympy simplify `Min(16, 16*s27)` to `16`.
    """
    expr = sympy.sympify(expr)
    expr = _own_functions(expr.xreplace({s: symbol(str(s)) for s in expr.free_symbols}))
    if expr.is_number:
        return int(expr)
    names = tuple(sorted(str(s) for s in expr.free_symbols))
    unknown = {type(f).__name__ for f in expr.atoms(sympy.Function)} - _FUNCTIONS
    if unknown:
        raise UnsupportedSize(f"size {expr} uses {', '.join(sorted(unknown))}")
    return SizeExpr(_PRINTER.doprint(expr), names)


def _own_functions(expr: sympy.Expr) -> sympy.Expr:
    """The shape environment's FloorDiv/PythonMod/Min/Max as this module's and sympy's: one canonical text."""
    if expr.is_Atom:
        return expr
    own = {"FloorDiv": FloorDiv, "PythonMod": sympy.Mod, "Min": sympy.Min, "Max": sympy.Max}

    def foreign(e: Any) -> bool:
        return type(e).__name__ in own and type(e) is not own[type(e).__name__]

    return expr.replace(foreign, lambda e: own[type(e).__name__](*e.args))


def to_expr(size: Size) -> sympy.Expr:
    if isinstance(size, SizeExpr):
        return _parse(size.text, size.symbols)
    return sympy.Integer(size)


class _TorchOps(ast.NodeTransformer):
    """`a // b` -> FloorDiv(a, b) and `a % b` -> Mod(a, b): the functions the shape environment uses."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        name = {ast.FloorDiv: "FloorDiv", ast.Mod: "Mod"}.get(type(node.op))
        if name is None:
            return node
        return ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], [])


@functools.lru_cache(maxsize=4096)
def _parse(text: str, names: tuple[str, ...]) -> sympy.Expr:
    tree = ast.fix_missing_locations(_TorchOps().visit(ast.parse(text, mode="eval")))
    env: dict[str, Any] = {n: symbol(n) for n in names}
    env.update(FloorDiv=FloorDiv, Mod=sympy.Mod, min=sympy.Min, max=sympy.Max)
    value = eval(compile(tree, "<size>", "eval"), {"__builtins__": {}}, env)  # noqa: S307 - a size text we printed
    return sympy.sympify(value)


def mul(a: Size, b: Size) -> Size:
    if type(a) is int and type(b) is int:
        return a * b
    return from_expr(to_expr(a) * to_expr(b))


def equal(a: Size, b: Size) -> bool:
    """Provably equal sizes (False when unknown)."""
    if a == b:
        return True
    if type(a) is int and type(b) is int:
        return False
    return bool(sympy.simplify(to_expr(a) - to_expr(b)) == 0)


def contiguous_strides(shape: Sequence[Size]) -> tuple[Size, ...]:
    """Row-major strides; symbolic sizes are at least 1 (the guard checks it), so no max(n, 1) for them."""
    strides: list[Size] = []
    step: Size = 1
    for n in reversed(shape):
        strides.append(step)
        step = mul(step, max(n, 1) if type(n) is int else n)
    return tuple(reversed(strides))


def product(sizes: Sequence[Size]) -> Size:
    result: Size = 1
    for n in sizes:
        result = mul(result, n)
    return result


def upper_bound(size: Size, ranges: Sequence[tuple[str, int, int | None]]) -> int | None:
    """The size with every symbol at its upper bound (a hint: exact for sums and products of sizes)."""
    return _at_bound(size, {name: high for name, _, high in ranges})


def lower_bound(size: Size, ranges: Sequence[tuple[str, int, int | None]]) -> int | None:
    """The size with every symbol at its lower bound (as `upper_bound`; symbols without a range are 1)."""
    return _at_bound(size, {name: low for name, low, _ in ranges}, default=1)


def _at_bound(size: Size, bounds: dict[str, int | None], default: int | None = None) -> int | None:
    if type(size) is int:
        return size
    assert isinstance(size, SizeExpr)
    values = {s: bounds.get(s, default) for s in size.symbols}
    if any(v is None for v in values.values()):
        return None
    value = to_expr(size).subs({symbol(s): v for s, v in values.items()})
    return int(value) if value.is_number else None
