"""What a generated Triton kernel can compute: the ATen overloads fusion takes, and for each pointwise one
the arguments its Triton expression accepts. Decisions only, no source: `passes.fusion` groups nodes and
decides which groups become kernels by these rules, and `codegen.triton.ops` writes the expressions of
what they accept.

Inside a kernel a tensor operand is `Typed`: only its register type counts here. Half and bfloat16
values compute in float32 (`compute_type`); a scalar argument is written as a literal of the type it
meets (`literal_fits`), and comparisons promote as ATen does (`common_type`). `accepts(target,
values, out_dtype)` is whether a pointwise node with these arguments has an expression; row
reductions over the last dimension are `ROW_OPS`, concatenation is `CAT`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opgen.runtime.ir.lines import Sym

FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int64", "int32", "int16", "int8", "uint8")
DTYPES = (*FLOATS, *INTS, "bool")
_RANK = {"bool": 0, "uint8": 1, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float32": 5, "float64": 6}


def compute_type(dtype: str) -> str:
    """The register type a value of `dtype` computes in."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


class Typed:
    """A tensor operand inside a kernel, as the rules see it: its register type `ctype` (`Register`, or
    the Triton backend's `Operand`, which also holds its expression)."""

    __slots__ = ()
    ctype: str


@dataclass(frozen=True, slots=True)
class Register(Typed):
    ctype: str


def literal_fits(value: Any, ctype: str) -> bool:
    """A Python scalar (or inf/nan symbol) can be written as a literal of register type `ctype`."""
    if isinstance(value, Sym) and value.kind == "float":
        return ctype in FLOATS
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return ctype in FLOATS
    return False


def _fits(value: Any, ctype: str) -> bool:
    """A tensor operand, or a scalar written as a literal of `ctype`."""
    return isinstance(value, Typed) or literal_fits(value, ctype)


def _kind(value: Any) -> str | None:
    """The register type a scalar argument asks for in promotion (ATen: a scalar never widens a tensor of its kind)."""
    if isinstance(value, Typed):
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
    tensors = [k for v, k in ((a, ka), (b, kb)) if isinstance(v, Typed)]
    scalars = [k for v, k in ((a, ka), (b, kb)) if not isinstance(v, Typed)]
    best = max(tensors, key=_RANK.__getitem__)
    for s in scalars:  # a scalar only raises the category (bool < int < float), to the default type
        if _category(s) > _category(best):
            best = s
    return best


def _category(ctype: str) -> int:
    return 0 if ctype == "bool" else 2 if ctype in FLOATS else 1


# ---- per pointwise overload: (its arguments, the result's register type) -> an expression exists ----

Rule = Callable[[Mapping[str, Any], str], bool]


def _binary(values: Mapping[str, Any], out: str) -> bool:
    a, b, alpha = values["self"], values["other"], values.get("alpha", 1)
    return _fits(a, out) and _fits(b, out) and (alpha == 1 or literal_fits(alpha, out))


def _div(values: Mapping[str, Any], out: str) -> bool:
    if out not in FLOATS or values.get("rounding_mode") not in (None, "floor", "trunc"):
        return False  # integer division rounds in ways Triton's `//` does not match
    return _both(values, out)


def _compare(values: Mapping[str, Any], out: str) -> bool:
    ctype = common_type(values["self"], values["other"])
    return ctype is not None and _fits(values["self"], ctype) and _fits(values["other"], ctype)


def _unary(floats_only: bool = True) -> Rule:
    def rule(values: Mapping[str, Any], out: str) -> bool:
        return (not floats_only or out in FLOATS) and isinstance(values["self"], Typed)

    return rule


def _both(values: Mapping[str, Any], out: str) -> bool:
    a, b = values["self"], values["other"]
    return _fits(a, out) and _fits(b, out)


def _clamp(values: Mapping[str, Any], out: str) -> bool:
    bounds = (values.get("min"), values.get("max"))
    return isinstance(values["self"], Typed) and all(b is None or literal_fits(b, out) for b in bounds)


def _hardtanh(values: Mapping[str, Any], out: str) -> bool:
    return _clamp({"self": values["self"], "min": values["min_val"], "max": values["max_val"]}, out)


def _leaky_relu(values: Mapping[str, Any], out: str) -> bool:
    slope, x = values["negative_slope"], values["self"]
    return literal_fits(slope, out) and isinstance(x, Typed) and out in FLOATS


def _gelu(values: Mapping[str, Any], out: str) -> bool:
    fits = isinstance(values["self"], Typed) and out in FLOATS
    return fits and values.get("approximate", "none") in ("tanh", "none")


POWERS = frozenset({2, 3, 1, 0.5, -0.5, -1, -2})  # the exponents `pow` is written for


def _pow(values: Mapping[str, Any], out: str) -> bool:
    x, exponent = values["self"], values["exponent"]
    if not isinstance(x, Typed) or isinstance(exponent, bool | Typed) or exponent not in POWERS:
        return False
    return out in FLOATS or (isinstance(exponent, int) and exponent >= 1)


def _where(values: Mapping[str, Any], out: str) -> bool:
    condition = values["condition"]
    return _both(values, out) and isinstance(condition, Typed)


def _masked_fill(values: Mapping[str, Any], out: str) -> bool:
    mask, x, fill = values["mask"], values["self"], values["value"]
    return isinstance(mask, Typed) and isinstance(x, Typed) and _fits(fill, out)


def _to_copy(values: Mapping[str, Any], out: str) -> bool:
    """A cast: only dtype (and memory format, which the output's strides carry) may change. A `device`
    argument is the one the group runs on (`type_as` and `.to(x)` name it): a group's values all live
    on one device (`passes.fusion.groups`), so a copy to another device never gets here."""
    if not isinstance(values["self"], Typed) or values.get("layout") not in (None, Sym("layout", "strided")):
        return False
    return values.get("pin_memory") in (None, False)


def _tensor(values: Mapping[str, Any], out: str) -> bool:
    return isinstance(values["self"], Typed)


def _logical_not(values: Mapping[str, Any], out: str) -> bool:
    return isinstance(values["self"], Typed) and out == "bool"


def _bitwise_not(values: Mapping[str, Any], out: str) -> bool:
    return isinstance(values["self"], Typed) and out not in FLOATS


def _bitwise(values: Mapping[str, Any], out: str) -> bool:
    """and/or/xor of integers or bools (ATen refuses floats), each operand in the result's type: a sliding
    window's mask is two comparisons and their `&`."""
    return out not in FLOATS and _both(values, out)  # a float literal does not fit an integer type


def _logical(values: Mapping[str, Any], out: str) -> bool:
    """logical and/or/xor of two tensors of any dtypes, each read as (x != 0): a bool result."""
    return isinstance(values["self"], Typed) and isinstance(values["other"], Typed) and out == "bool"


# clamp with one bound: the op and the bound it takes, computed as clamp with only that bound.
CLAMP_BOUNDS = {"aten.clamp_min.default": "min", "aten.clamp_max.default": "max"}


def one_bound(clamp: Callable[[Mapping[str, Any], str], Any], bound: str) -> Callable[[Mapping[str, Any], str], Any]:
    """`clamp` (a rule or an expression of aten.clamp) for a one-bound clamp op."""
    return lambda v, out: clamp({"self": v["self"], bound: v[bound]}, out)


POINTWISE: dict[str, Rule] = {
    **{f"aten.{op}.{kind}": _binary for op in ("add", "sub", "mul") for kind in ("Tensor", "Scalar")},
    "aten.div.Tensor": _div,
    "aten.div.Scalar": _div,
    "aten.div.Tensor_mode": _div,
    "aten.maximum.default": _both,
    "aten.minimum.default": _both,
    **{f"aten.{op}.{kind}": _compare for op in ("eq", "ne", "lt", "le", "gt", "ge") for kind in ("Tensor", "Scalar")},
    "aten.where.self": _where,
    "aten.masked_fill.Scalar": _masked_fill,
    "aten.neg.default": _unary(floats_only=False),
    "aten.abs.default": _unary(floats_only=False),
    "aten.relu.default": _unary(floats_only=False),
    **{f"aten.{op}.default": _unary() for op in ("sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "reciprocal",
                                                 "sin", "cos", "erf", "silu", "hardswish", "hardsigmoid")},
    "aten.gelu.default": _gelu,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.clamp.default": _clamp,
    **{target: one_bound(_clamp, bound) for target, bound in CLAMP_BOUNDS.items()},
    "aten.hardtanh.default": _hardtanh,
    "aten.leaky_relu.default": _leaky_relu,
    "aten._to_copy.default": _to_copy,
    "aten.clone.default": _tensor,
    "aten.logical_not.default": _logical_not,
    "aten.bitwise_not.default": _bitwise_not,
    **{f"aten.bitwise_{op}.{kind}": _bitwise for op in ("and", "or", "xor") for kind in ("Tensor", "Scalar")},
    **{f"aten.logical_{op}.default": _logical for op in ("and", "or", "xor")},
}  # fmt: skip


def accepts(target: str, values: Mapping[str, Any], out_dtype: str) -> bool:
    """A pointwise node of `target` with these arguments (tensors as `Typed`) has a Triton expression."""
    rule = POINTWISE.get(target)
    return rule is not None and rule(values, compute_type(out_dtype))


# Concatenation: not an expression of its operands at one index (each is read in its own range of
# the joined dimension); `passes.fusion.groups` and the Triton backend handle it.
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
EXTREMES = frozenset({"aten.amax.default", "aten.amin.default"})  # written for float32 and float64 results only
# The row ops whose result is one value a row (not one an element, as a softmax's): a row group of these alone
# can be computed at any element once its row's reductions are (`passes.fusion.attention_rows`).
REDUCTIONS = frozenset({"aten.sum.dim_IntList", "aten.mean.dim", *EXTREMES})


def row_fits(target: str, ctype: str) -> bool:
    """A row reduction whose result computes in `ctype` has a kernel (amax/amin of others stay ATen's)."""
    return target not in EXTREMES or ctype in ("float32", "float64")
