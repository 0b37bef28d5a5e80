"""What the fusion pass can put in a Triton kernel: each fusible ATen overload as a Triton expression.

A graph value lives in a kernel as an `Operand`: Triton expression text and its register type.
Half and bfloat16 values compute in float32, as Inductor does (ATen rounds after every op; the
difference stays within Inductor's tolerances); an explicit cast (`_to_copy`) rounds to its dtype.
`pointwise(target, values, out)` is the expression of one pointwise node, or None where this op,
with these argument values, is not fusible. Reductions over the last dimension are in `ROW_OPS`;
the Triton backend (`opgen.runtime.passes.fusion.triton`) expands them, since they need the whole row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opgen.runtime.ir import Sym

FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int64", "int32", "int16", "int8", "uint8")
DTYPES = (*FLOATS, *INTS, "bool")
_RANK = {"bool": 0, "uint8": 1, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float32": 5, "float64": 6}
TL = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float64": "tl.float64",
      "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
      "bool": "tl.int1"}  # fmt: skip


def compute_type(dtype: str) -> str:
    """The register type a value of `dtype` computes in."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@dataclass(frozen=True, slots=True)
class Operand:
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
    if isinstance(value, Sym) and value.kind == "float":
        return f'float("{value.value}")' if ctype in FLOATS else None
    if isinstance(value, bool):
        return str(value) if ctype == "bool" else str(int(value))
    if isinstance(value, int):
        return f"{float(value)!r}" if ctype in FLOATS else str(value)
    if isinstance(value, float):
        if ctype not in FLOATS:
            return None
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    return None


def _kind(value: Any) -> str | None:
    """The register type a scalar argument asks for in promotion (ATen: a scalar never widens a tensor of its kind)."""
    if isinstance(value, Operand):
        return value.ctype
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float) or (isinstance(value, Sym) and value.kind == "float"):
        return "float32"
    return None


def common_type(a: Any, b: Any) -> str | None:
    """ATen's result type of two operands, in register types (tensors of any rank treated alike)."""
    ka, kb = _kind(a), _kind(b)
    if ka is None or kb is None:
        return None
    tensors = [k for v, k in ((a, ka), (b, kb)) if isinstance(v, Operand)]
    scalars = [k for v, k in ((a, ka), (b, kb)) if not isinstance(v, Operand)]
    best = max(tensors, key=_RANK.__getitem__)
    for s in scalars:  # a scalar only raises the category (bool < int < float), to the default type
        if _category(s) > _category(best):
            best = s
    return best


def _category(ctype: str) -> int:
    return 0 if ctype == "bool" else 2 if ctype in FLOATS else 1


def _value(v: Any, ctype: str) -> str | None:
    return cast(v, ctype) if isinstance(v, Operand) else literal(v, ctype)


def _binary(symbol: str) -> Callable[[Mapping[str, Any], str], str | None]:
    def emit(values: Mapping[str, Any], out: str) -> str | None:
        a, b = _value(values["self"], out), _value(values["other"], out)
        alpha = values.get("alpha", 1)
        if a is None or b is None:
            return None
        if alpha != 1:
            scale = literal(alpha, out)
            if scale is None:
                return None
            b = f"{scale} * {b}"
        return f"{a} {symbol} {b}"

    return emit


def _div(values: Mapping[str, Any], out: str) -> str | None:
    mode = values.get("rounding_mode")
    if out not in FLOATS or mode not in (None, "floor", "trunc"):
        return None  # integer division rounds in ways Triton's `//` does not match
    a, b = _value(values["self"], out), _value(values["other"], out)
    if a is None or b is None:
        return None
    quotient = f"{a} / {b}"
    if mode == "floor":
        return f"tl.floor({quotient})"
    if mode == "trunc":
        return f"tl.where({quotient} < 0, tl.ceil({quotient}), tl.floor({quotient}))"
    return quotient


def _compare(symbol: str) -> Callable[[Mapping[str, Any], str], str | None]:
    def emit(values: Mapping[str, Any], out: str) -> str | None:
        ctype = common_type(values["self"], values["other"])
        if ctype is None:
            return None
        a, b = _value(values["self"], ctype), _value(values["other"], ctype)
        return None if a is None or b is None else f"{a} {symbol} {b}"

    return emit


def _unary(template: str, floats_only: bool = True) -> Callable[[Mapping[str, Any], str], str | None]:
    def emit(values: Mapping[str, Any], out: str) -> str | None:
        if floats_only and out not in FLOATS:
            return None
        x = values["self"]
        return template.format(x=cast(x, out)) if isinstance(x, Operand) else None

    return emit


def _nan_max(a: str, b: str) -> str:
    return f"tl.where(({a} > {b}) | ({a} != {a}), {a}, {b})"


def _nan_min(a: str, b: str) -> str:
    return f"tl.where(({a} < {b}) | ({a} != {a}), {a}, {b})"


def _extreme(pick: Callable[[str, str], str]) -> Callable[[Mapping[str, Any], str], str | None]:
    def emit(values: Mapping[str, Any], out: str) -> str | None:
        a, b = _value(values["self"], out), _value(values["other"], out)
        return None if a is None or b is None else pick(a, b)

    return emit


def _clamp(values: Mapping[str, Any], out: str) -> str | None:
    x = values["self"]
    if not isinstance(x, Operand):
        return None
    text = cast(x, out)
    low, high = values.get("min"), values.get("max")
    for bound, op in ((low, "<"), (high, ">")):
        if bound is None:
            continue
        b = literal(bound, out)
        if b is None:
            return None
        text = f"tl.where({text} {op} {b}, {b}, {text})"
    return text


def _hardtanh(values: Mapping[str, Any], out: str) -> str | None:
    return _clamp({"self": values["self"], "min": values["min_val"], "max": values["max_val"]}, out)


def _leaky_relu(values: Mapping[str, Any], out: str) -> str | None:
    slope = literal(values["negative_slope"], out)
    x = values["self"]
    if slope is None or not isinstance(x, Operand) or out not in FLOATS:
        return None
    t = cast(x, out)
    return f"tl.where({t} > 0, {t}, {t} * {slope})"


def _gelu(values: Mapping[str, Any], out: str) -> str | None:
    x = values["self"]
    if not isinstance(x, Operand) or out not in FLOATS:
        return None
    t = cast(x, out)
    if values.get("approximate", "none") == "tanh":
        inner = f"0.7978845608028654 * ({t} + 0.044715 * {t} * {t} * {t})"
        return f"0.5 * {t} * (1.0 + {_tanh(inner)})"
    if values.get("approximate", "none") != "none":
        return None
    return f"0.5 * {t} * (1.0 + tl.erf({t} * 0.7071067811865476))"


def _relu6_shifted(x: str) -> str:
    """clamp(x + 3, 0, 6), NaN kept (as ATen's min/max of a NaN)."""
    t = f"({x} + 3.0)"
    return f"tl.where({t} < 0.0, 0.0, tl.where({t} > 6.0, 6.0, {t}))"


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * ({x})) - 1.0)"


_POWERS = {2: "{x} * {x}", 3: "{x} * {x} * {x}", 1: "{x}", 0.5: "tl.sqrt({x})", -0.5: "tl.rsqrt({x})",
           -1: "1.0 / {x}", -2: "1.0 / ({x} * {x})"}  # fmt: skip


def _pow(values: Mapping[str, Any], out: str) -> str | None:
    x, exponent = values["self"], values["exponent"]
    if not isinstance(x, Operand) or isinstance(exponent, (bool, Operand)) or exponent not in _POWERS:
        return None
    if out not in FLOATS and (not isinstance(exponent, int) or exponent < 1):
        return None
    return _POWERS[exponent].format(x=cast(x, out))


def _where(values: Mapping[str, Any], out: str) -> str | None:
    cond = values["condition"]
    a, b = _value(values["self"], out), _value(values["other"], out)
    if not isinstance(cond, Operand) or a is None or b is None:
        return None
    return f"tl.where({cast(cond, 'bool')}, {a}, {b})"


def _masked_fill(values: Mapping[str, Any], out: str) -> str | None:
    mask, x = values["mask"], values["self"]
    fill = _value(values["value"], out)
    if not isinstance(mask, Operand) or not isinstance(x, Operand) or fill is None:
        return None
    return f"tl.where({cast(mask, 'bool')}, {fill}, {cast(x, out)})"


def _to_copy(values: Mapping[str, Any], out: str) -> str | None:
    """A cast: only dtype (and memory format, which the output's strides carry) may change. A `device`
    argument is the one the group runs on (`type_as` and `.to(x)` name it): a group's values all live
    on one device (groups._step), so a copy to another device never gets here."""
    x = values["self"]
    if not isinstance(x, Operand) or values.get("layout") not in (None, Sym("layout", "strided")):
        return None
    if values.get("pin_memory") not in (None, False):
        return None
    return cast(x, out)


def _identity(values: Mapping[str, Any], out: str) -> str | None:
    x = values["self"]
    return cast(x, out) if isinstance(x, Operand) else None


def _logical_not(values: Mapping[str, Any], out: str) -> str | None:
    x = values["self"]
    return f"{cast(x, 'bool')} == 0" if isinstance(x, Operand) and out == "bool" else None


def _bitwise_not(values: Mapping[str, Any], out: str) -> str | None:
    x = values["self"]
    if not isinstance(x, Operand) or out in FLOATS:
        return None
    return f"{x.text} == 0" if out == "bool" else f"~{cast(x, out)}"


Emit = Callable[[Mapping[str, Any], str], "str | None"]

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
    "aten.neg.default": _unary("-{x}", floats_only=False),
    "aten.abs.default": _unary("tl.abs({x})", floats_only=False),
    "aten.relu.default": _unary("tl.where({x} < 0, 0, {x})", floats_only=False),
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
    "aten.silu.default": _unary("{x} * tl.sigmoid({x})"),
    "aten.hardswish.default": _unary("{x} * " + _relu6_shifted("{x}") + " / 6.0"),
    "aten.hardsigmoid.default": _unary(_relu6_shifted("{x}") + " / 6.0"),
    "aten.gelu.default": _gelu,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.clamp.default": _clamp,
    "aten.clamp_min.default": lambda v, out: _clamp({"self": v["self"], "min": v["min"]}, out),
    "aten.clamp_max.default": lambda v, out: _clamp({"self": v["self"], "max": v["max"]}, out),
    "aten.hardtanh.default": _hardtanh,
    "aten.leaky_relu.default": _leaky_relu,
    "aten._to_copy.default": _to_copy,
    "aten.clone.default": _identity,
    "aten.logical_not.default": _logical_not,
    "aten.bitwise_not.default": _bitwise_not,
}  # fmt: skip

# Concatenation: not an expression of its operands at one index (each is read in its own range of
# the joined dimension); `groups` and the Triton backend handle it.
CAT = "aten.cat.default"

# Views the passes before fusion make and move (`split_bias`, `lift_views`): no kernel, a new shape or order.
VIEW, PERMUTE = "aten.view.default", "aten.permute.default"

# Reductions over the last dimension: target -> the argument naming the reduced dims ("" for softmax's `dim`).
ROW_OPS = {
    "aten._softmax.default": "dim",
    "aten._log_softmax.default": "dim",
    "aten.native_layer_norm.default": "normalized_shape",
    "aten.sum.dim_IntList": "dim",
    "aten.mean.dim": "dim",
    "aten.amax.default": "dim",
    "aten.amin.default": "dim",
}


def pointwise(target: str, values: Mapping[str, Any], out_dtype: str) -> str | None:
    """The Triton expression of one pointwise node (tensor arguments as `Operand`s), or None."""
    emit = POINTWISE.get(target)
    return emit(values, compute_type(out_dtype)) if emit is not None else None
