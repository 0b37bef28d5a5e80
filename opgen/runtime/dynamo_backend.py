"""The torch.compile backend `opgen` (registered through the `torch_dynamo_backends` entry point).

Dynamo hands over a torch-level graph; `aot_autograd` turns it into a functional ATen graph with
the same decompositions `opgen.compile` uses, and its forward compiler is opgen's pipeline with
the input check off (Dynamo's guards already check the inputs). Graphs Dynamo traced with
symbolic sizes (`dynamic=True`, `mark_dynamic`, or its automatic dynamic after a recompile) take
their SymInt inputs as Python ints named after their size symbols, and compile to one function
for the sizes Dynamo's guards admit. Inference only: a graph input that
requires grad while grad mode is on raises `RequiresGradError`, or with `options={"fallback": True}`
runs the graph eagerly with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx

from opgen.runtime.capture.decompositions import aot_decompositions
from opgen.runtime.capture.export import attr_constants, decompose_uncovered
from opgen.runtime.errors import OpgenWarning, RequiresGradError
from opgen.runtime.execution import executor
from opgen.runtime.execution.cuda_graphs import CudaGraphs, GraphOptions
from opgen.runtime.execution.guards import PROCEED
from opgen.runtime.lowering.signature import GraphSignature, OutputSpec, PlaceholderSpec
from opgen.runtime.lowering.symbolic import graph_symbols, shape_env_ranges
from opgen.runtime.pipeline import CompileOptions, compile_graph, default_pipeline, default_registry, kernel_ops_module
from opgen.runtime.report import Report


def _no_mismatch(set_check: Any, *args: Any) -> Any:
    return PROCEED  # unreachable: the backend's code has no input check


def compile_aten_graph(
    gm: torch.fx.GraphModule, options: CompileOptions, name: str, graphs: CudaGraphs | None = None
) -> Callable[..., Any]:
    """Compile an AOT forward graph: every placeholder is a positional input; outputs are a tuple.

    With `graphs`, the function is captured into a CUDA graph on its first call; parameters (the
    inputs AOT marks static) are used where they are instead of being copied.
    """
    placeholders = tuple(PlaceholderSpec(n.name, "input") for n in gm.graph.nodes if n.op == "placeholder")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    count = len(output.args[0]) if isinstance(output.args[0], list | tuple) else 1
    signature = GraphSignature(placeholders, tuple(OutputSpec("user") for _ in range(count)), "tuple")
    ranges = shape_env_ranges(gm, graph_symbols(gm))  # Dynamo's symbolic sizes (dynamic=True, mark_dynamic)
    graph, filename = compile_graph(gm, signature, options, name, ranges=ranges)
    constants = attr_constants(gm)
    with unset_fake_temporarily():  # AOT calls compilers under its fake mode; setup needs real tensors
        fn = executor.bind(graph, constants, executor.Runtime(_no_mismatch), kernel_ops_module(), filename)
    if graphs is not None:
        fn = graphs.wrap(fn, graph, constants, fixed=_static_inputs())
    status = getattr(fn, "graph_status", None)
    fn.artifact = graph  # type: ignore[attr-defined]
    fn.report = lambda: Report(  # type: ignore[attr-defined]
        name,
        graph.direct_nodes,
        graph.fallback_nodes,
        from_cache=graph.from_cache,
        cuda_graph=status.line() if status is not None else None,
    )
    return fn


def _static_inputs() -> list[int]:
    """Inputs that keep their address across calls (parameters), as AOT autograd records them."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    return list(getattr(metadata, "static_input_indices", None) or ())


def opgen_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """`torch.compile(model, backend="opgen", options={"fallback": False, "passes": (...), "cache": True,
    "cuda_graphs": False, "static_outputs": False})`."""
    options = {**(options.pop("options", None) or {}), **options}  # torch.compile passes options=dict
    fallback = bool(options.pop("fallback", False))
    passes = tuple(options.pop("passes", default_pipeline()))
    use_cache = bool(options.pop("cache", True))
    cuda_graphs = bool(options.pop("cuda_graphs", False))
    static_outputs = bool(options.pop("static_outputs", False))
    if options:
        known = "fallback, passes, cache, cuda_graphs, static_outputs"
        raise TypeError(f"opgen backend: unknown options {sorted(options)} (known: {known})")
    if static_outputs and not cuda_graphs:
        raise ValueError("opgen backend: static_outputs=True needs cuda_graphs=True")
    grad_inputs = [i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if grad_inputs and torch.is_grad_enabled():
        what = f"graph input {grad_inputs[0]} of the graph torch.compile captured (a parameter or an input)"
        if not fallback:
            raise RequiresGradError(what)
        warnings.warn(
            f"opgen backend: {what} requires grad; running this graph eagerly. To run it compiled, call the "
            "model under torch.no_grad() or torch.inference_mode(), or call model.requires_grad_(False)",
            OpgenWarning,
            stacklevel=2,
        )
        return gm.forward
    compile_options = CompileOptions(fallback, passes, use_cache, guard=False)
    name = type(gm).__name__
    graphs = CudaGraphs(GraphOptions(static_outputs), name, default_registry()) if cuda_graphs else None

    def forward_compiler(fx_gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        fx_gm = decompose_uncovered(
            fx_gm, lambda g, table: make_fx(g, decomposition_table=table)(*inputs), default_registry()
        )
        return compile_aten_graph(fx_gm, compile_options, name, graphs)

    decompositions = aot_decompositions(default_registry())
    return aot_autograd(fw_compiler=forward_compiler, decompositions=decompositions)(gm, example_inputs)  # type: ignore[no-any-return]
