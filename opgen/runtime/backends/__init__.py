"""Execution backends: what runs a compiled graph, and the choice between them (`backend=`).

The generated Python function (`codegen.python`, bound by `execution.executor`) is every graph's
base: it is always printed and bound, and it is what runs where no other backend can. Each other
backend is one `Target` registered in `TARGETS` below: it prints the graph's program for its
executor when the graph is compiled (`print_programs`; the artifact keeps each by backend name,
`CompiledGraph.printed_by`) and binds it when a function is made (`with_backend`). Adding a backend
is a module in this room and one line here.

`backend="python"` runs the generated Python; `"auto"` (the default) the first registered backend
that takes the graph, else the Python; a backend's name is "auto" with one OpgenWarning where the
graph stays Python. Either way the note for `report()` says which runs and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.backends import cpp
from opgen.runtime.backends.target import Target, Unavailable
from opgen.runtime.codegen.backend import Printed
from opgen.runtime.errors import warn
from opgen.runtime.ir import Program
from opgen.runtime.registry import KernelRegistry

TARGETS: dict[str, Target] = {cpp.NAME: cpp.TARGET}
BACKENDS = ("python", *TARGETS, "auto")

__all__ = ["BACKENDS", "TARGETS", "Target", "backend_note", "check_backend", "print_programs", "with_backend"]


def check_backend(backend: str, where: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
    return backend


def _targets(backend: str) -> list[Target]:
    """The backends `backend` may run on besides Python, in the order they are tried."""
    if backend == "python":
        return []
    return list(TARGETS.values()) if backend == "auto" else [TARGETS[backend]]


def print_programs(
    program: Program, registry: KernelRegistry, header: str, backend: str
) -> tuple[tuple[str, Printed], ...]:
    """Each backend's program for the graph, by name (none for the python backend)."""
    return tuple((t.name, t.print(program, registry, header)) for t in _targets(backend))


def backend_note(backend: str, ran: Target | None, reason: str = "") -> str:
    """The `report()` line: which backend runs (`ran`, None for the generated Python) and why."""
    if ran is not None:
        return f"backend: {ran.name} ({ran.note})"
    if backend == "python":
        return ""
    return f"backend: python ({backend!r} asked; {reason})"


def with_backend(
    backend: str,
    graph: CompiledGraph,
    python_fn: Callable[..., Any],
    constants: Mapping[str, Any],
    handler: Callable[..., Any],
    unflatten: Callable[[tuple[Any, ...]], Any] | None = None,
    jit: Mapping[str, Any] | None = None,
) -> tuple[Callable[..., Any], str]:
    """The function to run for `backend` and the note for `report()`: the first backend that binds the
    graph (`handler` is the input check's slow path, as the Python function's), else `python_fn`."""
    reason = ""
    for target in _targets(backend):
        try:
            fn = target.bind(graph, constants, handler, unflatten, python_fn=python_fn, jit=jit)
        except (Unavailable, *target.refusals) as exc:
            reason = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
            continue
        return fn, backend_note(backend, target)
    if backend in TARGETS:
        warn(f"opgen: graph {graph.name} runs on the Python backend: {reason}")
    return python_fn, backend_note(backend, None, reason)
