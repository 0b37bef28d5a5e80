"""The one bind path of the entry points: a compiled graph and its constants -> the function handed out.

`opgen.compile` and the torch.compile backend both bind here: the generated Python function
(`execution.executor`), then the backend asked for (`opgen.runtime.backends`: the C++ executor where
the program runs there), then CUDA-graph mode around it where asked. A package's loader binds its
program through the same C++ backend (`backends.cpp.bind_program`), without a Python function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.backends import with_backend
from opgen.runtime.execution import executor, size_graphs
from opgen.runtime.execution.cuda_graphs import CudaGraphs, GraphStatus
from opgen.runtime.pipeline import kernel_ops_module


@dataclass(frozen=True, slots=True)
class Bound:
    """A bound graph: the function to hand out, the `report()` line of its backend, its JIT bindings."""

    fn: Callable[..., Any]
    backend_line: str
    jit: Mapping[str, Any]

    @property
    def status(self) -> GraphStatus | None:
        """How CUDA-graph mode runs it (None outside that mode)."""
        return getattr(self.fn, "graph_status", None)


def bind(
    graph: CompiledGraph,
    constants: Mapping[str, torch.Tensor],
    handler: executor.Handler,
    filename: str,
    *,
    backend: str,
    unflatten: Callable[[tuple[Any, ...]], Any] | None = None,
    graphs: CudaGraphs | None = None,
    fixed: Sequence[int] = (),
    rebound: Sequence[int] = (),
) -> Bound:
    """Bind `graph` with `constants`; `handler(set_check, *args)` is its input check's slow path.

    `graphs`: CUDA-graph mode (`fixed`: inputs always passed at one address, not copied; `rebound`: inputs
    the graph writes, used in place wherever they live, else copied: `execution.address_graphs`).
    """
    rt = executor.Runtime(handler, unflatten=unflatten)
    fn = executor.bind(graph, constants, rt, kernel_ops_module(), filename)
    fn, backend_line = with_backend(backend, graph, fn, constants, rt.on_mismatch, unflatten, rt.jit)
    if graphs is not None:
        fn = size_graphs.wrap(graphs, fn, graph, constants, fixed=fixed, rebound=rebound)
    fn.artifact = graph  # type: ignore[attr-defined]
    return Bound(fn, backend_line, rt.jit)
