"""Binding a compiled graph's C++ program (codegen.cpp) to opgen's prebuilt C++ executor, and the tiering.

`bind_cpp` parses the program (`_C.cpp_function`), binds its constants and externs and runs its
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

`with_backend` is the tiering the entry points share: `backend="cpp"` and `"auto"` return the C++
function where the program binds, else the Python one, with (for "cpp") one OpgenWarning; either
way `backend_note` says which runs, for `report()`.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.errors import OpgenError, OpgenWarning
from opgen.runtime.execution.dynamic_guards import input_check, is_dynamic
from opgen.runtime.execution.guards import PROCEED

BACKENDS = ("python", "cpp", "auto")


class CppUnavailable(OpgenError):
    """The graph has no C++ program: what the C++ backend does not support in it yet."""

    def __init__(self, what: str) -> None:
        super().__init__(f"not supported by the cpp backend yet: {what}")
        self.what = what


def check_backend(backend: str, where: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
    return backend


def bind_cpp(
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
    if graph.cpp_error:
        raise CppUnavailable(graph.cpp_error)
    if not graph.cpp_program:
        raise CppUnavailable("a graph compiled without its C++ program (backend='python')")
    if os.environ.get("OPGEN_DEBUG", "") not in ("", "0"):
        print(f"# opgen: C++ executor program for graph {graph.key[:16]}\n{graph.cpp_program}", file=sys.stderr)
    from opgen import _C

    tensors = [constants[key] for _, key in graph.constants]
    jit = jit or {}
    fused = {name: jit.get(name) for name in re.findall(r"^alternative (\S+) triton$", graph.cpp_program, re.M)}
    externs = dict(inspect.getclosurevars(python_fn).nonlocals)
    externs.update({f"{name}.launcher": _launcher(name, binding) for name, binding in fused.items()})
    resolver = functools.partial(picks, fused) if fused else None
    check = input_check(graph.inputs, graph.size_ranges) if is_dynamic(graph.inputs) else None
    fn: Callable[..., Any] = _C.cpp_function(
        graph.cpp_program, tensors, externs, handler, PROCEED, unflatten, resolver, check
    )
    return fn


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


def backend_note(backend: str, ran: str, reason: str = "") -> str:
    if ran == "cpp":
        return "backend: cpp (opgen's C++ executor runs the program; backend='python' for the generated Python)"
    if backend == "python":
        return ""
    return f"backend: python ({backend!r} asked; {reason})"


def with_backend(
    backend: str,
    graph: CompiledGraph,
    python_fn: Callable[..., Any],
    bind: Callable[..., Callable[..., Any]],
) -> tuple[Callable[..., Any], str]:
    """The function to run for `backend` and the note for `report()`. `bind(python_fn=...)` makes the
    C++ function."""
    if backend == "python":
        return python_fn, ""
    try:
        fn = bind(python_fn=python_fn)
    except (CppUnavailable, ValueError, RuntimeError, TypeError) as exc:
        reason = str(exc) if isinstance(exc, CppUnavailable) else f"{type(exc).__name__}: {exc}"
        if backend == "cpp":
            warnings.warn(f"opgen: graph {graph.name} runs on the Python backend: {reason}", OpgenWarning, stacklevel=4)
        return python_fn, backend_note(backend, "python", reason)
    return fn, backend_note(backend, "cpp")
