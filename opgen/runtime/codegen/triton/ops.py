"""The Triton expression of each pointwise ATen overload a generated kernel computes.

A graph value lives in a kernel as an `Operand`: Triton expression text and its register type.
Half and bfloat16 values compute in float32, as Inductor does (ATen rounds after every op; the
difference stays within Inductor's tolerances); an explicit cast (`_to_copy`) rounds to its dtype.
Which overloads and arguments have an expression is decided in `opgen.runtime.ir.fusible` (the
fusion pass groups by it); here each accepted one is written: `pointwise(target, values, out)` is the
expression of one node, or None where the rules do not accept it. Reductions over the last
dimension (`ROW_OPS`) need the whole row: the group printer (`codegen.triton.groups`) expands them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opgen.runtime.ir import Sym
from opgen.runtime.ir.fusible import (
    CLAMP_BOUNDS,
    FLOATS,
    Typed,
    accepts,
    common_type,
    compute_type,
    literal_fits,
    one_bound,
)

TL = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float64": "tl.float64",
      "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
      "bool": "tl.int1"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Operand(Typed):
    text: str  # a Triton expression or a local name
    ctype: str  # its register type (compute_type of a dtype)


def cast(value: Operand, ctype: str) -> str:
    if value.ctype == ctype:
        return value.text
    if ctype == "bool":
        return f"({value.text} != 0)"
    return f"{value.text}.to({TL[ctype]})"


def literal(value: Any, ctype: str) -> str | None:
    """A Python scalar (or inf/nan symbol) as Triton source of register type `ctype`; None if it can't be."""
    if not literal_fits(value, ctype):
        return None
    if isinstance(value, Sym):
        return f'float("{value.value}")'
    if isinstance(value, bool):
        return str(value) if ctype == "bool" else str(int(value))
    if isinstance(value, int):
        return f"{float(value)!r}" if ctype in FLOATS else str(value)
    return repr(value) if math.isfinite(value) else f'float("{value}")'


def _value(v: Any, ctype: str) -> str:
    """A tensor operand or a scalar the rules accept, as an expression of register type `ctype`."""
    text = cast(v, ctype) if isinstance(v, Operand) else literal(v, ctype)
    assert text is not None, (v, ctype)
    return text


# ---- per pointwise overload: (its arguments, the result's register type) -> its expression, for the
# arguments `ir.fusible` accepts (tensors as `Operand`s) ----

Emit = Callable[[Mapping[str, Any], str], str]


def _binary(symbol: str) -> Emit:
    def emit(values: Mapping[str, Any], out: str) -> str:
        a, b = _value(values["self"], out), _value(values["other"], out)
        alpha = values.get("alpha", 1)
        if alpha != 1:
            b = f"{literal(alpha, out)} * {b}"
        return f"{a} {symbol} {b}"

    return emit


def _div(values: Mapping[str, Any], out: str) -> str:
    quotient = f"{_value(values['self'], out)} / {_value(values['other'], out)}"
    mode = values.get("rounding_mode")
    if mode == "floor":
        return f"tl.floor({quotient})"
    if mode == "trunc":
        return f"tl.where({quotient} < 0, tl.ceil({quotient}), tl.floor({quotient}))"
    return quotient


def _compare(symbol: str) -> Emit:
    def emit(values: Mapping[str, Any], out: str) -> str:
        ctype = common_type(values["self"], values["other"])
        assert ctype is not None
        return f"{_value(values['self'], ctype)} {symbol} {_value(values['other'], ctype)}"

    return emit


def _unary(template: str) -> Emit:
    def emit(values: Mapping[str, Any], out: str) -> str:
        return template.format(x=cast(values["self"], out))

    return emit


def _nan_max(a: str, b: str) -> str:
    return f"tl.where(({a} > {b}) | ({a} != {a}), {a}, {b})"


def _nan_min(a: str, b: str) -> str:
    return f"tl.where(({a} < {b}) | ({a} != {a}), {a}, {b})"


def _extreme(pick: Callable[[str, str], str]) -> Emit:
    def emit(values: Mapping[str, Any], out: str) -> str:
        return pick(_value(values["self"], out), _value(values["other"], out))

    return emit


def _clamp(values: Mapping[str, Any], out: str) -> str:
    text = cast(values["self"], out)
    for bound, op in ((values.get("min"), "<"), (values.get("max"), ">")):
        if bound is not None:
            b = literal(bound, out)
            text = f"tl.where({text} {op} {b}, {b}, {text})"
    return text


def _hardtanh(values: Mapping[str, Any], out: str) -> str:
    return _clamp({"self": values["self"], "min": values["min_val"], "max": values["max_val"]}, out)


def _leaky_relu(values: Mapping[str, Any], out: str) -> str:
    t = cast(values["self"], out)
    return f"tl.where({t} > 0, {t}, {t} * {literal(values['negative_slope'], out)})"


def _gelu(values: Mapping[str, Any], out: str) -> str:
    return gelu(cast(values["self"], out), values.get("approximate", "none"))


def gelu(t: str, approximate: str) -> str:
    """gelu of the float32 expression `t`, exact ("none") or tanh-approximated ("tanh"), as ATen's."""
    if approximate == "tanh":
        inner = f"0.7978845608028654 * ({t} + 0.044715 * {t} * {t} * {t})"
        return f"0.5 * {t} * (1.0 + {_tanh(inner)})"
    return f"0.5 * {t} * (1.0 + tl.erf({t} * 0.7071067811865476))"


def silu(t: str) -> str:
    return f"{t} * tl.sigmoid({t})"


def _relu6_shifted(x: str) -> str:
    """clamp(x + 3, 0, 6), NaN kept (as ATen's min/max of a NaN)."""
    t = f"({x} + 3.0)"
    return f"tl.where({t} < 0.0, 0.0, tl.where({t} > 6.0, 6.0, {t}))"


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * ({x})) - 1.0)"


# The exponents of `ir.fusible.POWERS`.
_POWERS = {2: "{x} * {x}", 3: "{x} * {x} * {x}", 1: "{x}", 0.5: "tl.sqrt({x})", -0.5: "tl.rsqrt({x})",
           -1: "1.0 / {x}", -2: "1.0 / ({x} * {x})"}  # fmt: skip


def _pow(values: Mapping[str, Any], out: str) -> str:
    return _POWERS[values["exponent"]].format(x=cast(values["self"], out))


def _where(values: Mapping[str, Any], out: str) -> str:
    a, b = _value(values["self"], out), _value(values["other"], out)
    return f"tl.where({cast(values['condition'], 'bool')}, {a}, {b})"


def _masked_fill(values: Mapping[str, Any], out: str) -> str:
    fill = _value(values["value"], out)
    return f"tl.where({cast(values['mask'], 'bool')}, {fill}, {cast(values['self'], out)})"


def _cast(values: Mapping[str, Any], out: str) -> str:
    """A copy (`clone`) or a cast (`_to_copy`: how it rounds, the group printer writes)."""
    return cast(values["self"], out)


def _logical_not(values: Mapping[str, Any], out: str) -> str:
    return f"{cast(values['self'], 'bool')} == 0"


def _bitwise_not(values: Mapping[str, Any], out: str) -> str:
    x = values["self"]
    return f"{x.text} == 0" if out == "bool" else f"~{cast(x, out)}"


def _logical(symbol: str) -> Emit:
    """logical and/or/xor: each operand tested against zero (`cast` to bool), then combined as int1."""

    def emit(values: Mapping[str, Any], out: str) -> str:
        return f"({cast(values['self'], 'bool')}) {symbol} ({cast(values['other'], 'bool')})"

    return emit


POINTWISE: dict[str, Emit] = {
    **{f"aten.{op}.{kind}": _binary(sym) for op, sym in (("add", "+"), ("sub", "-"), ("mul", "*"))
       for kind in ("Tensor", "Scalar")},
    "aten.div.Tensor": _div,
    "aten.div.Scalar": _div,
    "aten.div.Tensor_mode": _div,
    "aten.maximum.default": _extreme(_nan_max),
    "aten.minimum.default": _extreme(_nan_min),
    **{f"aten.{op}.{kind}": _compare(sym)
       for op, sym in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))
       for kind in ("Tensor", "Scalar")},
    "aten.where.self": _where,
    "aten.masked_fill.Scalar": _masked_fill,
    "aten.neg.default": _unary("-{x}"),
    "aten.abs.default": _unary("tl.abs({x})"),
    "aten.relu.default": _unary("tl.where({x} < 0, 0, {x})"),
    "aten.sigmoid.default": _unary("tl.sigmoid({x})"),
    "aten.tanh.default": _unary(_tanh("{x}")),
    "aten.exp.default": _unary("tl.exp({x})"),
    "aten.log.default": _unary("tl.log({x})"),
    "aten.sqrt.default": _unary("tl.sqrt({x})"),
    "aten.rsqrt.default": _unary("tl.rsqrt({x})"),
    "aten.reciprocal.default": _unary("1.0 / {x}"),
    "aten.sin.default": _unary("tl.sin({x})"),
    "aten.cos.default": _unary("tl.cos({x})"),
    "aten.erf.default": _unary("tl.erf({x})"),
    "aten.silu.default": _unary(silu("{x}")),
    "aten.hardswish.default": _unary("{x} * " + _relu6_shifted("{x}") + " / 6.0"),
    "aten.hardsigmoid.default": _unary(_relu6_shifted("{x}") + " / 6.0"),
    "aten.gelu.default": _gelu,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.clamp.default": _clamp,
    **{target: one_bound(_clamp, bound) for target, bound in CLAMP_BOUNDS.items()},
    "aten.hardtanh.default": _hardtanh,
    "aten.leaky_relu.default": _leaky_relu,
    "aten._to_copy.default": _cast,
    "aten.clone.default": _cast,
    "aten.logical_not.default": _logical_not,
    "aten.bitwise_not.default": _bitwise_not,
    **{f"aten.bitwise_{op}.{kind}": _binary(sym) for op, sym in (("and", "&"), ("or", "|"), ("xor", "^"))
       for kind in ("Tensor", "Scalar")},
    **{f"aten.logical_{op}.default": _logical(sym) for op, sym in (("and", "&"), ("or", "|"), ("xor", "^"))},
}  # fmt: skip


def pointwise(target: str, values: Mapping[str, Any], out_dtype: str) -> str | None:
    """The Triton expression of one pointwise node (tensor arguments as `Operand`s), or None where
    `ir.fusible` does not accept these arguments."""
    if not accepts(target, values, out_dtype):
        return None
    return POINTWISE[target](values, compute_type(out_dtype))
