"""The executor: turns a `CompiledGraph` into a callable. The artifact is data; this is what runs it.

The source is compiled under a real file name (the cache entry's `graph.py`, or `<opgen:key>`),
registered in `linecache` (`source_lines`: for as long as the function lives) so tracebacks and
debuggers show the generated lines, and executed once; its `make` factory binds kernels, ATen ops,
symbols, constants and runtime helpers as closure locals and returns the function that runs the
graph. OPGEN_DEBUG=1 prints the source.

Profiling: the generated function hands each call to its profiled twin (`codegen.profiled`) while
`torch.autograd.profiler._is_profiler_enabled` is set (by `torch.profiler.profile`,
`torch.autograd.profiler.profile`, `emit_nvtx` and `emit_itt`); the twin opens its ranges with
`_RecordFunctionFast`, the cheapest record_function torch has (the one Inductor's kernels use).
With no profiler on, the cost is that one flag read per call.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.autograd.profiler

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.errors import OpgenError
from opgen.runtime.execution import source_lines
from opgen.runtime.execution.guards import PROCEED, Check, never
from opgen.runtime.ir import Sym
from opgen.runtime.torch_symbols import from_sym

# The slow path: `handler(set_check, *args)` returns a result, raises, or returns PROCEED to run this
# specialization; `set_check` replaces the function's input check.
Handler = Callable[..., Any]


@dataclass
class Runtime:
    """What generated code binds from `rt`: the input check, its slow path, and helpers."""

    handler: Handler
    check: Check = never
    unflatten: Callable[[tuple[Any, ...]], Any] | None = None
    PROCEED: object = PROCEED
    grad_enabled: Callable[[], bool] = torch.is_grad_enabled
    empty_strided: Callable[..., torch.Tensor] = torch.empty_strided
    as_strided: Callable[..., torch.Tensor] = torch.as_strided
    lock: Any = field(default_factory=threading.Lock)
    set_check: Callable[[Check], None] | None = None  # filled in by `bind` once the function exists
    jit: Mapping[str, Any] = field(default_factory=dict)  # JIT launchers by local name (filled in by `bind`)
    profiler: Any = torch.autograd.profiler  # its `_is_profiler_enabled` picks the profiled twin
    record: Callable[[str], Any] = torch._C._profiler._RecordFunctionFast  # a profiler range (a context manager)

    def on_mismatch(self, *args: Any) -> Any:
        assert self.set_check is not None
        return self.handler(self.set_check, *args)


def resolve_op(target: str) -> Any:
    """`aten.sort.default` -> torch.ops.aten.sort.default; `py:_operator.mul` -> operator.mul."""
    if target.startswith("py:"):
        module, _, name = target[3:].rpartition(".")
        return getattr(importlib.import_module(module), name)
    obj: Any = torch.ops
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def bind(
    graph: CompiledGraph,
    constants: Mapping[str, torch.Tensor],
    rt: Runtime,
    kernel_ops: Any,
    filename: str | None = None,
) -> Callable[..., Any]:
    """Execute the graph's source and return its function, bound to these constants."""
    filename = filename or f"<opgen:{graph.key[:16]}>"
    missing = [key for _, key in graph.constants if key not in constants]
    if missing:
        raise OpgenError(f"cannot bind compiled graph {graph.key[:16]}: no value for constants {missing[:5]}")
    held = source_lines.hold(filename, graph.source)
    if os.environ.get("OPGEN_DEBUG", "") not in ("", "0"):
        print(f"# opgen: generated code for graph {graph.key[:16]} ({filename})\n{graph.source}", file=sys.stderr)
    namespace: dict[str, Any] = {"__name__": f"opgen.generated_{graph.key[:12]}"}
    exec(compile(graph.source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 - our own generated code
    ops = {target: resolve_op(target) for target in graph.fallbacks}
    if graph.jit_kernels or graph.choices:
        from opgen.jit.graph import choices, launchers  # launchers start compiling in the background

        rt.jit = {**launchers(graph.jit_kernels, graph.inputs), **choices(graph.choices, kernel_ops)}
    if graph.fused:
        from opgen.runtime.execution.fused import bindings  # each fused kernel starts compiling in the background

        rt.jit = {**rt.jit, **bindings(graph.fused)}
    if graph.collectives:
        from opgen.runtime.execution.collectives import bindings as collectives  # resolves the process groups

        rt.jit = {**rt.jit, **collectives(graph.collectives)}
    symbols = {local: from_sym(Sym(kind, value)) for local, kind, value in graph.symbols}
    fn: Callable[..., Any] = namespace["make"](kernel_ops, ops, constants, symbols, rt)
    rt.set_check = _cell_setter(fn, "_check")
    source_lines.release_with(fn, filename, held)
    return fn


def _cell_setter(fn: Callable[..., Any], name: str) -> Callable[[Any], None]:
    """Rebinds one closure variable of `fn` (the input check) without a `nonlocal` on the fast path."""
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None) or ()
    if code is None or name not in code.co_freevars:
        return lambda value: None
    cell = closure[code.co_freevars.index(name)]

    def set_value(value: Any) -> None:
        cell.cell_contents = value

    return set_value
