"""The torch.compile backend `opgen` (registered through the `torch_dynamo_backends` entry point).

Dynamo hands over a torch-level graph; `aot_autograd` turns it into a functional ATen graph with
the same decompositions `opgen.compile` uses, and its forward compiler is opgen's pipeline with
the input check off (Dynamo's guards already check the inputs). Graphs Dynamo traced with
symbolic sizes (`dynamic=True`, `mark_dynamic`, or its automatic dynamic after a recompile) take
their SymInt inputs as Python ints named after their size symbols, and compile to one function
for the sizes Dynamo's guards admit. Inference only: a graph input that
requires grad while grad mode is on raises `RequiresGradError`, or with `options={"fallback": True}`
runs the graph eagerly with a warning.

Writes to graph inputs (a module's buffers, such as a static KV cache; in-place updates of the
caller's tensors; writes through views of them) stay in the graph, as Inductor keeps them: AOT hands
them over as `copy_` into the input, and opgen's passes write the input in place. Nothing is copied
back per call.

Freezing (`options={"freezing": True}`, the default; Inductor's `freezing` for this backend): a
graph compiled with grad off binds the module parameters and buffers Dynamo passes as inputs, and
that it neither writes nor returns a view of, as constants, so the constant passes (batch-norm
folding, prepacking, constant folding) run on them as under `opgen.compile`. Dynamo does not guard
their identity; the function checks it on each call (`opgen.runtime.execution.frozen`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.source import is_from_unspecialized_param_buffer_source
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx

from opgen.runtime.backends import check_backend
from opgen.runtime.capture.decompositions import aot_decompositions
from opgen.runtime.capture.export import attr_constants, decompose_uncovered
from opgen.runtime.errors import RequiresGradError, warn
from opgen.runtime.execution.cuda_graphs import CudaGraphs, GraphOptions
from opgen.runtime.execution.frozen import frozen_function
from opgen.runtime.execution.guards import PROCEED
from opgen.runtime.frontend.bind import bind
from opgen.runtime.ir.signature import GraphSignature, OutputSpec, PlaceholderSpec
from opgen.runtime.lowering.symbolic import graph_symbols, shape_env_ranges
from opgen.runtime.pipeline import (
    CompileOptions,
    compile_graph,
    default_pipeline,
    default_registry,
    start_jit_workers,
)
from opgen.runtime.report import Report, jit_lines


def _no_mismatch(set_check: Any, *args: Any) -> Any:
    return PROCEED  # unreachable: the backend's code has no input check


@dataclass(frozen=True, slots=True)
class Frozen:
    """Inputs of an AOT forward graph to bind as constants: their positions and the tensors they hold now."""

    positions: tuple[int, ...] = ()
    tensors: tuple[torch.Tensor, ...] = ()
    kept_state: int = 0  # parameters and buffers left as inputs (the graph writes them or returns a view of them)


def compile_aten_graph(
    gm: torch.fx.GraphModule,
    options: CompileOptions,
    name: str,
    graphs: CudaGraphs | None = None,
    frozen: Frozen = Frozen(),
) -> Callable[..., Any]:
    """Compile an AOT forward graph: every placeholder is a positional input; outputs are a tuple.

    `frozen` inputs are bound as constants (the constant passes see them); the function still takes
    every input and checks by identity that those positions hold the tensors bound
    (`opgen.runtime.execution.frozen`). With `graphs`, the function is captured into a CUDA graph
    on its first call; parameters (the inputs AOT marks static) are used where they are instead of
    being copied.
    """
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    keys = {i: f"frozen:{nodes[i].name}" for i in frozen.positions}
    placeholders = tuple(
        PlaceholderSpec(n.name, "constant", keys[i]) if i in keys else PlaceholderSpec(n.name, "input")
        for i, n in enumerate(nodes)
    )
    output = next(n for n in gm.graph.nodes if n.op == "output")
    count = len(output.args[0]) if isinstance(output.args[0], list | tuple) else 1
    signature = GraphSignature(placeholders, tuple(OutputSpec("user") for _ in range(count)), "tuple")
    ranges = shape_env_ranges(gm, graph_symbols(gm))  # Dynamo's symbolic sizes (dynamic=True, mark_dynamic)
    graph, filename = compile_graph(gm, signature, options, name, ranges=ranges)
    constants = attr_constants(gm)
    kept = [i for i in range(len(nodes)) if i not in keys]
    # Inputs at a fixed address (parameters), as positions among the function's own inputs. The ones the graph
    # writes, marked static or not (transformers' StaticCache, which each generate() call makes anew: marked
    # where the prefill ran eagerly), are used in place wherever they live, the graph repointed at them, else
    # copied in and out at new addresses and used in place where their addresses come back
    # (execution.address_graphs).
    fixed = [kept.index(i) for i in _static_inputs() if i in kept and kept.index(i) not in graph.written_inputs]
    rebound = list(graph.written_inputs)

    backend_lines: list[str] = []
    launchers: dict[str, Any] = {}  # the latest binding's JIT kernels, for report()

    def make(tensors: Sequence[torch.Tensor]) -> Callable[..., Any]:
        bound = {**constants, **{keys[i]: t for i, t in zip(frozen.positions, tensors, strict=True)}}
        with unset_fake_temporarily():  # AOT calls compilers under its fake mode; setup needs real tensors
            b = bind(
                graph, bound, _no_mismatch, filename, backend=options.backend, graphs=graphs, fixed=fixed,
                rebound=rebound,
            )  # fmt: skip
        backend_lines[:] = [b.backend_line] if b.backend_line else []
        launchers.clear()
        launchers.update(b.jit or {})
        return b.fn

    if frozen.positions:
        fn = frozen_function(make, frozen.positions, kept, frozen.tensors)
        status = getattr(fn.bindings[0][1], "graph_status", None)  # type: ignore[attr-defined]
    else:
        fn = make(())
        status = getattr(fn, "graph_status", None)
    fn.artifact = graph  # type: ignore[attr-defined]
    fn.report = lambda: Report(  # type: ignore[attr-defined]
        name,
        graph.direct_nodes,
        graph.fallback_nodes,
        torch_ops=tuple(op for op in graph.fallbacks if op not in {f for _, f in graph.fallback_nodes}),
        from_cache=graph.from_cache,
        cuda_graph=status.line() if status is not None else None,
        notes=(*graph.notes, *_freezing_notes(frozen), *backend_lines),
        jit=jit_lines(graph, launchers),
    )
    return fn


def _freezing_notes(frozen: Frozen) -> tuple[str, ...]:
    if not frozen.positions and not frozen.kept_state:
        return ()
    count = len(frozen.positions)
    notes = [f"frozen: {count} parameters and buffers bound as constants (options={{'freezing': False}}: inputs)"]
    if frozen.kept_state:
        notes.append(f"not frozen: {frozen.kept_state} parameters and buffers the graph writes or returns a view of")
    return tuple(notes)


def _static_inputs() -> list[int]:
    """Inputs that keep their address across calls (parameters), as AOT autograd records them."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    return list(getattr(metadata, "static_input_indices", None) or ())


def frozen_inputs(state: Sequence[bool], real: Sequence[Any], count: int) -> Frozen:
    """Which inputs of the AOT forward graph being compiled to freeze (call it from AOT's forward compiler).

    `state`: per Dynamo graph input, whether it is a parameter or buffer of a module; `real`: the
    tensors Dynamo passed. AOT puts the module's own parameters first where Dynamo made them
    attributes of its graph (`tracing_context.params_flat`; none with `inline_inbuilt_nn_modules`).
    Frozen: module state the graph neither writes nor returns a view of (AOT's `fw_metadata`), plain
    dense tensors. Anything that does not line up (AOT added or merged inputs) freezes nothing.
    """
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    if context is None or metadata is None:
        return Frozen()
    params = list(context.params_flat or ())
    values, is_state = [*params, *real], [True] * len(params) + list(state)
    if not len(values) == len(is_state) == len(metadata.input_info) == count:
        return Frozen()
    viewed = {o.base_idx for o in metadata.output_info if o.base_idx is not None}
    positions, kept_state = [], 0
    for i, (value, info) in enumerate(zip(values, metadata.input_info, strict=True)):
        if not is_state[i] or type(value) not in (torch.Tensor, torch.nn.Parameter) or value.is_sparse:
            continue
        if info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata or i in viewed:
            kept_state += 1
        else:
            positions.append(i)
    return Frozen(tuple(positions), tuple(values[i] for i in positions), kept_state)


def module_state(gm: torch.fx.GraphModule) -> list[bool]:
    """Per input of a Dynamo graph: whether Dynamo read it from a module's parameters or buffers."""
    flags = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = getattr(node.meta.get("grapharg"), "source", None)
            flags.append(source is not None and is_from_unspecialized_param_buffer_source(source))
    return flags


def opgen_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """`torch.compile(model, backend="opgen", options={"fallback": False, "passes": (...), "cache": True,
    "cuda_graphs": False, "static_outputs": False, "freezing": True, "backend": "auto"})`; `backend` as in
    `opgen.compile` ("python", "cpp" or "auto")."""
    options = {**(options.pop("options", None) or {}), **options}  # torch.compile passes options=dict
    fallback = bool(options.pop("fallback", False))
    passes = tuple(options.pop("passes", default_pipeline()))
    use_cache = bool(options.pop("cache", True))
    cuda_graphs = bool(options.pop("cuda_graphs", False))
    static_outputs = bool(options.pop("static_outputs", False))
    freezing = bool(options.pop("freezing", True))
    backend = check_backend(options.pop("backend", "auto"), "opgen backend")
    if options:
        known = "fallback, passes, cache, cuda_graphs, static_outputs, freezing, backend"
        raise TypeError(f"opgen backend: unknown options {sorted(options)} (known: {known})")
    if static_outputs and not cuda_graphs:
        raise ValueError("opgen backend: static_outputs=True needs cuda_graphs=True")
    grad_inputs = [i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if grad_inputs and torch.is_grad_enabled():
        what = f"graph input {grad_inputs[0]} of the graph torch.compile captured (a parameter or an input)"
        if not fallback:
            raise RequiresGradError(what)
        warn(
            f"opgen backend: {what} requires grad; running this graph eagerly. To run it compiled, call the "
            "model under torch.no_grad() or torch.inference_mode(), or call model.requires_grad_(False)"
        )
        return gm.forward
    compile_options = CompileOptions(fallback, passes, use_cache, guard=False, backend=backend)
    name = type(gm).__name__
    graphs = CudaGraphs(GraphOptions(static_outputs), name) if cuda_graphs else None

    freeze = freezing and not torch.is_grad_enabled()  # inference: the weights are constants (as Inductor's freezing)
    state = module_state(gm) if freeze else [False] * len(example_inputs)
    values = [t if is_state else None for t, is_state in zip(example_inputs, state, strict=True)]  # not user inputs

    def forward_compiler(fx_gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        frozen = frozen_inputs(state, values, len(inputs)) if freeze else Frozen()
        fx_gm = decompose_uncovered(
            fx_gm, lambda g, table: make_fx(g, decomposition_table=table)(*inputs), default_registry()
        )
        return compile_aten_graph(fx_gm, compile_options, name, graphs, frozen)

    start_jit_workers(passes, example_inputs)  # during aot_autograd's trace
    decompositions = aot_decompositions(default_registry())
    # Input mutations stay in the graph (`copy_` into the input, as Inductor keeps them): opgen's passes
    # write the buffer in place (reinplace), and AOT's runtime wrapper copies nothing back. Without it the
    # graph returned each written buffer anew and the wrapper copied it into the module on every call:
    # a decode step copied its whole KV cache twice a token.
    aot = aot_autograd(fw_compiler=forward_compiler, decompositions=decompositions, keep_inference_input_mutations=True)
    return aot(gm, example_inputs)  # type: ignore[no-any-return]
