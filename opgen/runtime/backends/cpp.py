"""The C++ backend: the graph's program printed for opgen's prebuilt C++ executor (`codegen.cpp`),
and bound to it.

`bind` parses the program (`_C.cpp_function`), binds its constants and externs and runs its
setup, less what the Python function's setup made already (its packed and folded weights, taken
from its closure by name: the program's `shared` lines); the result is a `CppFunction`, called
like the generated Python function: the same input check (its mismatches go to the same slow
path; with dynamic shapes, the same ranged check object), the same results.

The externs (Triton launchers, fused kernels' choices, `py:` functions, collectives) are the very
objects the generated Python function calls, taken from its closure by the same local names, and
each fused kernel's launcher. A fused kernel's call is settled after the first call (`picks`): the
executor then runs the picked alternative, the Triton launch or the ATen calls, in place of the
call. While a profiler is on, the executor runs each kernel call in a range named after its node,
as the Python function's profiled twin does. OPGEN_DEBUG=1 prints the program.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.backends.target import Target, Unavailable
from opgen.runtime.codegen import cpp
from opgen.runtime.codegen.backend import Printed
from opgen.runtime.errors import OpgenError
from opgen.runtime.execution.dynamic_guards import input_check, is_dynamic
from opgen.runtime.execution.guards import PROCEED
from opgen.runtime.ir import Program
from opgen.runtime.registry import KernelRegistry

NAME = "cpp"


class CppUnavailable(Unavailable):
    """The graph has no C++ program: what the C++ backend does not support in it yet."""

    def __init__(self, what: str) -> None:
        super().__init__(NAME, what)


def bind(
    graph: CompiledGraph,
    constants: Mapping[str, torch.Tensor],
    handler: Callable[..., Any],
    unflatten: Callable[[tuple[Any, ...]], Any] | None = None,
    *,
    python_fn: Callable[..., Any],
    jit: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The graph's C++ program, bound; `handler(*args)` is the input check's slow path, `python_fn`
    the generated Python function of the same graph (whose callables the program's externs are),
    `jit` the runtime's bindings of its kernels (`Runtime.jit`: fused kernels' launchers, choices)."""
    printed = graph.printed_by(NAME)
    if printed.error:
        raise CppUnavailable(printed.error)
    if not printed.text:
        raise CppUnavailable("a graph compiled without its C++ program (backend='python')")
    program = printed.text
    if os.environ.get("OPGEN_DEBUG", "") not in ("", "0"):
        print(f"# opgen: C++ executor program for graph {graph.key[:16]}\n{program}", file=sys.stderr)
    tensors = [constants[key] for _, key in graph.constants]
    jit = jit or {}
    fused = {name: jit.get(name) for name in re.findall(r"^alternative (\S+) triton$", program, re.M)}
    externs = dict(inspect.getclosurevars(python_fn).nonlocals)
    externs.update({f"{name}.launcher": _launcher(name, binding) for name, binding in fused.items()})
    resolver = functools.partial(picks, fused) if fused else None
    check = input_check(graph.inputs, graph.size_ranges) if is_dynamic(graph.inputs) else None
    return bind_program(program, tensors, externs, handler, unflatten, resolver, check)


def bind_program(
    program: str,
    constants: Sequence[torch.Tensor],
    externs: Mapping[str, Any],
    handler: Callable[..., Any],
    unflatten: Callable[[tuple[Any, ...]], Any] | None = None,
    resolver: Callable[[], Any] | None = None,
    check: Any = None,
) -> Callable[..., Any]:
    """A program text bound to the C++ executor (a compiled graph's, or a package's, which has no externs)."""
    from opgen import _C

    fn: Callable[..., Any] = _C.cpp_function(program, constants, externs, handler, PROCEED, unflatten, resolver, check)
    return fn


def print_program(program: Program, registry: KernelRegistry, header: str) -> Printed:
    try:
        return Printed(cpp.emit(program, registry, header).text)
    except cpp.CppUnsupported as exc:
        return Printed(error=exc.what)


TARGET = Target(
    NAME,
    print_program,
    bind,
    note="opgen's C++ executor runs the program; backend='python' for the generated Python",
    refusals=(ValueError, RuntimeError, TypeError),  # what _C.cpp_function raises for a program it rejects
)


def _launcher(name: str, binding: Any) -> Any:
    """A fused kernel's launcher, or a function saying why there is none (its Triton side is then
    never picked)."""
    launcher = getattr(binding, "launcher", None)
    if launcher is not None:
        return launcher

    def unavailable(*args: Any) -> None:
        raise OpgenError(f"fused kernel {name} has no Triton launcher ({getattr(binding, 'error', 'not bound')})")

    return unavailable


def picks(fused: Mapping[str, Any]) -> dict[str, str] | None:
    """What each fused kernel's first call picked ("triton" or "aten"), once every one has picked
    (None before). A kernel whose Triton side did not load runs its ATen calls; bindings other than
    `FusedBinding`s (tests bind their own) stay calls."""
    from opgen.runtime.execution.fused import FusedBinding

    out = {}
    for name, binding in fused.items():
        if not isinstance(binding, FusedBinding):
            continue
        if binding.choice is None:
            out[name] = "aten"
            continue
        if len(binding.choice.picks) != 1:
            return None
        ((pick, _),) = binding.choice.picks.values()
        out[name] = pick
    return out
