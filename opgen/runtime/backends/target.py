"""What an execution backend is: one object that prints a graph's program for its executor and binds it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opgen.runtime.codegen.backend import Printed
from opgen.runtime.errors import OpgenError
from opgen.runtime.ir import Program
from opgen.runtime.registry import KernelRegistry

# print(program, registry, header) -> its text, or why the backend cannot run it yet
Print = Callable[[Program, KernelRegistry, str], Printed]
# bind(graph, constants, handler, unflatten, *, python_fn, jit) -> the callable that runs the graph
Bind = Callable[..., Callable[..., Any]]


class Unavailable(OpgenError):
    """A backend has no program for this graph: what it does not support in it yet."""

    def __init__(self, backend: str, what: str) -> None:
        super().__init__(f"not supported by the {backend} backend yet: {what}")
        self.what = what


@dataclass(frozen=True, slots=True)
class Target:
    """A backend beside the generated Python: its name (`backend="..."`), its printer and its binder.

    `bind(graph, constants, handler, unflatten, *, python_fn, jit)` takes the graph's printed program
    (`graph.printed_by(name)`); `python_fn` is the generated Python function of the same graph, whose
    closure holds the callables a program may call back (externs), `jit` the runtime's bindings of its
    Triton kernels. `Unavailable`, or an exception of a type in `refusals` (a program its executor
    rejects), means "this graph runs on Python instead". `note` says what runs, for `report()`.
    """

    name: str
    print: Print
    bind: Bind
    note: str
    refusals: tuple[type[Exception], ...] = ()
