"""The input check of a function compiled for dynamic shapes, and what it says when inputs do not fit.

An input spec's sizes and strides are ints or size texts: a plain symbol (`s27`) or an expression
over symbols (`16*s27`). The check binds each symbol from the first dimension that is exactly it,
requires every other occurrence to be equal (the equalities export recorded: one symbol shared by
several dimensions), every symbol to lie in its range, and every expression to evaluate to the
input's size or stride. It is a small generated Python function (about 1 us for one 3-d input);
the static check stays the C++ one (`guards.fast_check`). `explain` says which input, dimension,
size and range failed, for the errors of the slow path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opgen._C import RangedInputCheck
from opgen.runtime.execution.guards import Check, InputSpec, fast_check
from opgen.runtime.ir import SizeExpr
from opgen.runtime.ir.sizes import SizeRange, contiguous_strides


def is_dynamic(specs: Sequence[InputSpec]) -> bool:
    return any(type(n) is not int for s in specs for n in (*s.shape, *s.stride))


def input_check(specs: Sequence[InputSpec], ranges: Sequence[SizeRange]) -> Check:
    """The C++ check for static specs (as fast as ever); for symbolic ones the C++ ranged check where
    every size is fixed or a plain symbol and every stride fixed or row-major, else the generated one."""
    if not is_dynamic(specs):
        return fast_check(specs)
    ranged = _ranged_specs(specs, ranges)
    if ranged is None:
        return dynamic_check(specs, ranges)
    return RangedInputCheck(*ranged)  # type: ignore[no-any-return]


def _ranged_specs(specs: Sequence[InputSpec], ranges: Sequence[SizeRange]) -> tuple[list[Any], list[Any]] | None:
    index = {r.symbol: k for k, r in enumerate(ranges)}
    expected = []
    for spec in specs:
        if not all(type(n) is int or n in index for n in spec.shape):
            return None
        shape = tuple(n if type(n) is int else SizeExpr(n, (n,)) for n in spec.shape)
        row_major = contiguous_strides(shape)
        strides = []
        for n, want in zip(spec.stride, row_major, strict=True):
            if type(n) is int:
                strides.append(n)
            elif isinstance(want, SizeExpr) and want.text == n:
                strides.append(-1)
            else:
                return None
        sizes = [n if type(n) is int else -(index[n] + 1) for n in spec.shape]
        expected.append((getattr(torch, spec.dtype), torch.device(spec.device), sizes, strides))
    return expected, [(r.low, -1 if r.high is None else r.high) for r in ranges]


def _condition(value: str, expected: int | str, bound: set[str], lines: list[str], deferred: list[str]) -> None:
    """Append the test of `value` (a size or stride read from the input) against its spec entry."""
    if type(expected) is int:
        lines.append(f"    if {value} != {expected}: return False")
    elif expected.isidentifier() and expected not in bound:
        bound.add(expected)
        lines.append(f"    {expected} = {value}")
    else:
        deferred.append(f"    if {value} != ({expected}): return False")


def check_source(specs: Sequence[InputSpec], ranges: Sequence[SizeRange]) -> str:
    args = ", ".join(f"a{i}" for i in range(len(specs)))
    lines = [f"def check({args}):"]
    deferred: list[str] = []
    bound: set[str] = set()
    for i, spec in enumerate(specs):
        a = f"a{i}"
        lines.append(
            f"    if type({a}) is not Tensor or {a}.dtype is not dtype{i} or {a}.device != device{i} "
            f"or {a}.requires_grad: return False"
        )
        lines.append(f"    shape{i} = {a}.shape")
        lines.append(f"    if len(shape{i}) != {len(spec.shape)}: return False")
        for d, n in enumerate(spec.shape):
            _condition(f"shape{i}[{d}]", n, bound, lines, deferred)
        if spec.stride:
            lines.append(f"    stride{i} = {a}.stride()")
        for d, n in enumerate(spec.stride):
            _condition(f"stride{i}[{d}]", n, bound, lines, deferred)
    for r in ranges:
        if r.symbol in bound:
            high = f" or {r.symbol} > {r.high}" if r.high is not None else ""
            lines.append(f"    if {r.symbol} < {r.low}{high}: return False")
    return "\n".join([*lines, *deferred, "    return True", ""])


def dynamic_check(specs: Sequence[InputSpec], ranges: Sequence[SizeRange]) -> Check:
    """The generated check for these specs (TypeError-free: anything unexpected returns False)."""
    namespace: dict[str, Any] = {"Tensor": torch.Tensor}
    for i, spec in enumerate(specs):
        namespace[f"dtype{i}"] = getattr(torch, spec.dtype)
        namespace[f"device{i}"] = torch.device(spec.device)
    source = check_source(specs, ranges)
    exec(compile(source, "<opgen input check>", "exec"), namespace)  # noqa: S102 - our own generated code
    check = namespace["check"]
    check.source = source
    return check  # type: ignore[no-any-return]


def explain(specs: Sequence[InputSpec], ranges: Sequence[SizeRange], args: Sequence[torch.Tensor]) -> str | None:
    """Why tensors of the right dtype, device and rank do not fit the specs (None: they fit)."""
    by_symbol = {r.symbol: r for r in ranges}
    env: dict[str, int] = {}
    for position, (spec, value) in enumerate(zip(specs, args, strict=True), start=1):
        for d, (n, actual) in enumerate(zip(spec.shape, value.shape, strict=True)):
            where = f"input '{spec.name}' (position {position}), dimension {d}"
            message = _explain_size(where, n, int(actual), env, by_symbol)
            if message is not None:
                return message
    for position, (spec, value) in enumerate(zip(specs, args, strict=True), start=1):
        try:
            expected = tuple(_value(n, env) for n in spec.stride)
        except NameError:
            continue
        if expected != tuple(value.stride()):
            return (
                f"input '{spec.name}' (position {position}): compiled for strides {expected} at these sizes "
                f"(from {spec.stride}), got strides {tuple(value.stride())}"
            )
    return None


def _explain_size(
    where: str, expected: int | str, actual: int, env: dict[str, int], ranges: dict[str, SizeRange]
) -> str | None:
    if type(expected) is int:
        return None if actual == expected else f"{where}: compiled for size {expected} (static), got {actual}"
    if expected.isidentifier() and expected not in env:
        env[expected] = actual
        r = ranges.get(expected)
        if r is not None and not r.contains(actual):
            return f"{where}: size {actual} is outside the compiled range {r.text()} of dynamic size {expected}"
        return None
    try:
        want = _value(expected, env)
    except NameError:  # a symbol bound by a later dimension: the check after binding says the rest
        return None
    if want != actual:
        return f"{where}: size {actual} breaks the relation recorded at export: it must equal {expected} = {want}"
    return None


def _value(n: int | str, env: dict[str, int]) -> int:
    if type(n) is int:
        return n
    return int(eval(n, {"__builtins__": {"min": min, "max": max}}, dict(env)))  # noqa: S307 - a size text we printed
