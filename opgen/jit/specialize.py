"""A Triton function's specialization for given arguments, computed as Triton's own launcher does.

Triton compiles one binary per specialization: the type of every argument (a pointer's element
type, i32 or i64), 16-byte alignment of pointers and divisibility by 16 of integers, integers
equal to 1 and Nones baked in as constants, and the constexpr values. This module asks Triton's
`native_specialize_impl` (the function its generated binder calls) for each argument, so opgen
specializes exactly as `kernel[grid](...)` would, and describes the result twice: as Triton's
compile inputs (signature, constexprs, attributes) and as the `ParamSpec`s the C++ launcher checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opgen.jit.binary import ParamSpec
from opgen.jit.errors import JitError

_SCALAR_KINDS = {"i32": "i32", "i64": "i64", "u64": "u64", "fp32": "fp32", "fp64": "fp64", "u1": "u1"}


@dataclass(frozen=True, slots=True)
class Specialization:
    signature: dict[str, str]  # param name -> Triton type ("*fp32", "i32", "constexpr")
    constexprs: dict[tuple[int, ...], Any]  # (param index,) -> value
    attrs: dict[tuple[int, ...], list[list[Any]]]  # (param index,) -> [["tt.divisibility", 16]]
    params: tuple[ParamSpec, ...]  # one per runtime parameter

    def key(self) -> tuple[Any, ...]:
        return (
            tuple(self.signature.items()),
            tuple(sorted((k, repr(v)) for k, v in self.constexprs.items())),
            tuple(sorted((k, repr(v)) for k, v in self.attrs.items())),
        )


def runtime_params(fn: Any) -> list[Any]:
    return [p for p in fn.params if not p.is_constexpr]


def constexpr_names(fn: Any) -> list[str]:
    return [p.name for p in fn.params if p.is_constexpr]


def specialize(fn: Any, args: Sequence[Any], meta: Mapping[str, Any], backend: Any) -> Specialization:
    """`args` are the runtime parameters' values in order, `meta` the constexprs."""
    from triton._C.libtriton import native_specialize_impl

    runtime = runtime_params(fn)
    if len(args) != len(runtime):
        names = ", ".join(p.name for p in runtime)
        raise TypeError(f"{fn.__name__} takes {len(runtime)} runtime arguments ({names}), got {len(args)}")
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    specs: list[ParamSpec] = []
    values = iter(args)
    for p in fn.params:
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(p.num,)] = _constexpr_value(fn, p, meta)
            continue
        value = next(values)
        ty, attr = native_specialize_impl(
            backend, value, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment
        )
        if p.annotation_type:
            no_specialize = p.annotation_type == "u1" or p.annotation_type[:2] in ("fp", "bf")
            ty, attr = (p.annotation_type, None) if no_specialize else (p.annotation_type, attr)
        signature[p.name] = ty
        if ty == "constexpr":
            constexprs[(p.num,)] = value
        if isinstance(attr, str):
            attrs[(p.num,)] = backend.parse_attr(attr)
        specs.append(_param_spec(p.name, ty, attr, value))
    return Specialization(signature, constexprs, attrs, tuple(specs))


def _constexpr_value(fn: Any, p: Any, meta: Mapping[str, Any]) -> Any:
    if p.name in meta:
        return meta[p.name]
    if p.has_default:
        return p.default
    raise JitError(f"{fn.__name__}: no value for constexpr parameter {p.name!r} (give it as a meta-parameter)")


def _param_spec(name: str, ty: str, attr: Any, value: Any) -> ParamSpec:
    divisible = isinstance(attr, str) and "D" in attr
    if ty == "constexpr":
        return ParamSpec(name, "const_none" if value is None else "const_one")
    if ty.startswith("*"):
        dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
        if not dtype:
            raise JitError(f"argument {name!r}: a pointer parameter takes a tensor, got {type(value).__name__}")
        return ParamSpec(name, "ptr", dtype, align16=divisible)
    if ty not in _SCALAR_KINDS:
        raise JitError(f"argument {name!r}: opgen's launcher does not pass Triton type {ty!r} yet")
    return ParamSpec(name, _SCALAR_KINDS[ty], div16=divisible)
