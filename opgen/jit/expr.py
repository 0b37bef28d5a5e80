"""Integer expressions over a kernel's arguments: grids, and the arguments of spec Triton ops.

One small language serves the spec (`grid: [cdiv(n_elements, BLOCK)]`, parsed from text) and the
user API (a grid lambda such as `lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)`, traced
with proxies). An expression becomes a *program*: a flat tuple of ints that the C++ launcher
evaluates on each call with a small stack machine, so computing a grid costs no Python.

    expr := int | name | expr (+ - * //) expr | -expr | (expr)
          | numel(t) | size(t, d) | stride(t, d) | cdiv(a, b) | max(a, b) | min(a, b)

Pure Python (no torch): the generator validates spec entries with it inside the build.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Union

# Opcodes of a program (mirrored in csrc/opgen/jit/jit_launcher.cpp).
CONST, ARG, NUMEL, SIZE, STRIDE, ADD, SUB, MUL, FLOORDIV, MAX, MIN, NEG = range(12)
_BINARY = {"+": ADD, "-": SUB, "*": MUL, "//": FLOORDIV, "max": MAX, "min": MIN}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
TENSOR_FUNCTIONS = ("numel", "size", "stride")
FUNCTIONS = {"numel": 1, "size": 2, "stride": 2, "cdiv": 2, "max": 2, "min": 2}


class ExprError(ValueError):
    """An expression outside the language, or naming what it may not."""


@dataclass(frozen=True, slots=True)
class Const:
    value: int


@dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclass(frozen=True, slots=True)
class TensorProp:
    """`numel(t)`, `size(t, d)` or `stride(t, d)` of the tensor named `tensor`."""

    fn: str
    tensor: str
    dim: int = 0


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str  # "+" "-" "*" "//" "max" "min"
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr


Expr = Union[Const, Name, TensorProp, BinOp, Neg]  # noqa: UP007


def cdiv(a: Expr, b: Expr) -> Expr:
    return BinOp("//", BinOp("-", BinOp("+", a, b), Const(1)), b)


def parse(text: str) -> Expr:
    """Parse one expression; `ExprError` says what is wrong."""
    if not isinstance(text, (str, int)) or isinstance(text, bool):
        raise ExprError(f"expected an expression (a string or an int), got {type(text).__name__}")
    if isinstance(text, int):
        return Const(text)
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {text!r}: {exc.msg}") from None
    return _from_ast(tree, text)


def _from_ast(node: ast.expr, text: str) -> Expr:
    match node:
        case ast.Constant(value=int() as value) if not isinstance(value, bool):
            return Const(value)
        case ast.Name(id=name):
            return Name(name)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return Neg(_from_ast(operand, text))
        case ast.BinOp(op=op, left=left, right=right) if type(op) in _AST_OPS:
            return BinOp(_AST_OPS[type(op)], _from_ast(left, text), _from_ast(right, text))
        case ast.Call(func=ast.Name(id=fn), args=args, keywords=[]) if fn in FUNCTIONS:
            return _call(fn, args, text)
    shown = ast.get_source_segment(text, node) or text
    raise ExprError(
        f"{shown!r} is not allowed in {text!r} (allowed: ints, names, + - * //, "
        "numel(t), size(t, d), stride(t, d), cdiv(a, b), max(a, b), min(a, b))"
    )


def _call(fn: str, args: list[ast.expr], text: str) -> Expr:
    if len(args) != FUNCTIONS[fn]:
        raise ExprError(f"{fn}() takes {FUNCTIONS[fn]} argument(s), got {len(args)} in {text!r}")
    if fn in TENSOR_FUNCTIONS:
        if not isinstance(args[0], ast.Name):
            raise ExprError(f"{fn}() needs a tensor's name as its first argument in {text!r}")
        dim = 0
        if fn != "numel":
            d = args[1]
            if not (isinstance(d, ast.Constant) and isinstance(d.value, int) and not isinstance(d.value, bool)):
                raise ExprError(f"{fn}() needs a literal int dimension in {text!r}")
            dim = d.value
        return TensorProp(fn, args[0].id, dim)
    a, b = (_from_ast(x, text) for x in args)
    return cdiv(a, b) if fn == "cdiv" else BinOp(fn, a, b)


def names(expr: Expr) -> Iterator[str]:
    """Plain names the expression reads (not the tensors of numel/size/stride)."""
    match expr:
        case Name(name=name):
            yield name
        case BinOp(left=left, right=right):
            yield from names(left)
            yield from names(right)
        case Neg(operand=operand):
            yield from names(operand)


def tensors(expr: Expr) -> Iterator[str]:
    """Names used as tensors (in numel/size/stride)."""
    match expr:
        case TensorProp(tensor=tensor):
            yield tensor
        case BinOp(left=left, right=right):
            yield from tensors(left)
            yield from tensors(right)
        case Neg(operand=operand):
            yield from tensors(operand)


def to_program(expr: Expr, params: Mapping[str, int], meta: Mapping[str, int]) -> tuple[int, ...]:
    """The stack program; `params` maps kernel parameter names to their runtime positions, `meta`
    gives the values of constexprs (and of parameters fixed for this variant)."""
    out: list[int] = []
    _emit(expr, params, meta, out)
    return tuple(out)


def _emit(expr: Expr, params: Mapping[str, int], meta: Mapping[str, int], out: list[int]) -> None:
    match expr:
        case Const(value=value):
            out += [CONST, value]
        case Name(name=name) if name in meta:
            value = meta[name]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ExprError(f"{name} is {value!r}, not an int")
            out += [CONST, value]
        case Name(name=name) if name in params:
            out += [ARG, params[name]]
        case Name(name=name):
            raise ExprError(f"unknown name {name!r} (known: {', '.join([*params, *meta]) or 'none'})")
        case TensorProp(fn=fn, tensor=tensor, dim=dim):
            if tensor not in params:
                raise ExprError(f"{fn}({tensor}): {tensor!r} is not a tensor parameter of the kernel")
            out += [NUMEL, params[tensor]] if fn == "numel" else [SIZE if fn == "size" else STRIDE, params[tensor], dim]
        case BinOp(op=op, left=left, right=right):
            _emit(left, params, meta, out)
            _emit(right, params, meta, out)
            out.append(_BINARY[op])
        case Neg(operand=operand):
            _emit(operand, params, meta, out)
            out.append(NEG)


def to_cpp(expr: Expr, resolve: Callable[[str], str]) -> str:
    """The expression as C++ computing an `int64_t`; `resolve` gives the C++ of a name (an int
    local, or a tensor for numel/size/stride). `//` keeps Python's rounding through
    `opgen::jit::floordiv` (csrc/opgen/jit/jit_binding.h), which raises on a zero divisor."""
    match expr:
        case Const(value=value):
            return f"int64_t({value})"
        case Name(name=name):
            return f"int64_t({resolve(name)})"
        case TensorProp(fn="numel", tensor=tensor):
            return f"{resolve(tensor)}.numel()"
        case TensorProp(fn=fn, tensor=tensor, dim=dim):
            return f"{resolve(tensor)}.{fn}({dim})"
        case BinOp(op="//", left=left, right=right):
            return f"opgen::jit::floordiv({to_cpp(left, resolve)}, {to_cpp(right, resolve)})"
        case BinOp(op="max" | "min" as fn, left=left, right=right):
            return f"std::{fn}<int64_t>({to_cpp(left, resolve)}, {to_cpp(right, resolve)})"
        case BinOp(op=op, left=left, right=right):
            return f"({to_cpp(left, resolve)} {op} {to_cpp(right, resolve)})"
        case Neg(operand=operand):
            return f"(-{to_cpp(operand, resolve)})"
    raise ExprError(f"not an expression: {expr!r}")


def evaluate(program: tuple[int, ...], args: list[object]) -> int:
    """The program's value for these arguments, in Python (tests and the slow path check C++ against it)."""
    stack: list[int] = []
    pc = 0
    while pc < len(program):
        op = program[pc]
        if op == CONST:
            stack.append(program[pc + 1])
            pc += 2
        elif op == ARG:
            stack.append(int(args[program[pc + 1]]))  # type: ignore[call-overload]
            pc += 2
        elif op == NUMEL:
            stack.append(args[program[pc + 1]].numel())  # type: ignore[attr-defined]
            pc += 2
        elif op in (SIZE, STRIDE):
            t = args[program[pc + 1]]
            stack.append(t.size(program[pc + 2]) if op == SIZE else t.stride(program[pc + 2]))  # type: ignore[attr-defined]
            pc += 3
        elif op == NEG:
            stack.append(-stack.pop())
            pc += 1
        else:
            b, a = stack.pop(), stack.pop()
            stack.append(_APPLY[op](a, b))
            pc += 1
    return stack[-1]


_APPLY: dict[int, Callable[[int, int], int]] = {
    ADD: lambda a, b: a + b,
    SUB: lambda a, b: a - b,
    MUL: lambda a, b: a * b,
    FLOORDIV: lambda a, b: a // b,
    MAX: max,
    MIN: min,
}


# --- tracing a grid function ------------------------------------------------------------------------


class _Sym:
    """An int-like proxy that records arithmetic as an `Expr`."""

    __slots__ = ("expr",)

    def __init__(self, expr: Expr) -> None:
        self.expr = expr

    def _bin(self, op: str, other: object, flip: bool = False) -> _Sym:
        o = _lift(other)
        return _Sym(BinOp(op, o, self.expr) if flip else BinOp(op, self.expr, o))

    def __add__(self, o: object) -> _Sym:
        return self._bin("+", o)

    def __radd__(self, o: object) -> _Sym:
        return self._bin("+", o, True)

    def __sub__(self, o: object) -> _Sym:
        return self._bin("-", o)

    def __rsub__(self, o: object) -> _Sym:
        return self._bin("-", o, True)

    def __mul__(self, o: object) -> _Sym:
        return self._bin("*", o)

    def __rmul__(self, o: object) -> _Sym:
        return self._bin("*", o, True)

    def __floordiv__(self, o: object) -> _Sym:
        return self._bin("//", o)

    def __rfloordiv__(self, o: object) -> _Sym:
        return self._bin("//", o, True)

    def __neg__(self) -> _Sym:
        return _Sym(Neg(self.expr))

    def __bool__(self) -> bool:
        raise _Untraceable("the grid branches on an argument's value")

    def __index__(self) -> int:
        raise _Untraceable("the grid needs an argument's value as a plain int")

    __int__ = __index__


class _TensorSym:
    """A tensor proxy: numel(), size(d), stride(d) and shape[d] become expressions."""

    __slots__ = ("name", "shape")

    def __init__(self, name: str, ndim: int) -> None:
        self.name = name
        self.shape = tuple(_Sym(TensorProp("size", name, d)) for d in range(ndim))

    def numel(self) -> _Sym:
        return _Sym(TensorProp("numel", self.name))

    def size(self, dim: int) -> _Sym:
        return self.shape[dim]

    def stride(self, dim: int) -> _Sym:
        return _Sym(TensorProp("stride", self.name, dim))

    def __getattr__(self, attr: str) -> object:
        raise _Untraceable(f"the grid reads tensor attribute {attr!r}")


class _Untraceable(Exception):
    pass


def _lift(value: object) -> Expr:
    if isinstance(value, _Sym):
        return value.expr
    if isinstance(value, int) and not isinstance(value, bool):
        return Const(value)
    raise _Untraceable(f"the grid computes with {type(value).__name__} values")


def trace_grid(
    grid: Callable[[dict[str, object]], object], runtime: Mapping[str, object], constexprs: Mapping[str, object]
) -> tuple[Expr, ...] | None:
    """Trace `grid(meta)` with proxies for the runtime parameters (`runtime` maps name -> example
    value: tensors become tensor proxies, ints int proxies). None when the function does something
    the language cannot express (then it is called in Python on every launch)."""
    meta: dict[str, object] = dict(constexprs)
    for name, value in runtime.items():
        ndim = getattr(value, "ndim", None)
        if isinstance(ndim, int):
            meta[name] = _TensorSym(name, ndim)
        elif isinstance(value, int) and not isinstance(value, bool):
            meta[name] = _Sym(Name(name))
        else:
            meta[name] = value
    try:
        result = grid(meta)
        items = result if isinstance(result, (tuple, list)) else (result,)
        if not 1 <= len(items) <= 3:
            return None
        return tuple(_lift(item) for item in items)
    except Exception:
        return None
