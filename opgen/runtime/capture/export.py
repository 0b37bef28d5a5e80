"""Capture: torch.export, decomposition to ops kernel_ops covers, and what the graph's inputs are.

Where torch allows it, export and decomposition are one trace (`opgen.runtime.capture.one_trace`);
elsewhere `torch.export.export`, then `run_decompositions`. Decomposition runs torch's default table
(the core ATen op set) less the fused kernels kernel_ops binds
(`opgen.runtime.capture.decompositions`), then, for ops left in the graph that kernel_ops does not
bind but torch can decompose, one more decomposition each, kept only if it succeeds, leaves a
functional graph and does not bring in ops kernel_ops lacks (torch's own tables often lower to
`prims`, some to mutating ops such as `prims.copy_to`). A decomposition that fails is skipped:
the op stays in the graph, and lowering names it (or calls it, with fallback=True).

Before decomposition, tensors torch.export lifts in a form its own retrace cannot take (a KV cache
held outside the module: one tensor lifted twice, or a constant the graph writes) are rewritten
(`opgen.runtime.capture.lifted`). Where torch's decomposition still fails as a whole, the error is a
`DecompositionError` naming the model and what to do, never torch's internal assertion.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from opgen.runtime.capture.decompositions import decomposition_table
from opgen.runtime.capture.lifted import buffers_for_written_constants, shared_memory
from opgen.runtime.capture.one_trace import export_decomposed
from opgen.runtime.capture.torch_noise import torch_noise_silenced
from opgen.runtime.errors import OpgenError
from opgen.runtime.ir.signature import GraphSignature, OutputSpec, PlaceholderSpec
from opgen.runtime.registry import KernelRegistry

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class DecompositionError(OpgenError):
    """torch.export captured the model, but torch's `run_decompositions` failed on the graph."""

    def __init__(self, model: str, inputs: str, cause: BaseException, shared: Sequence[str] = ()) -> None:
        views = "".join(f" The graph reads {pair} as separate inputs that share memory." for pair in shared)
        super().__init__(
            f"opgen.compile: torch.export captured {model} for inputs ({inputs}), but torch failed to decompose "
            f"the exported graph to the ATen ops opgen lowers (ExportedProgram.run_decompositions raised "
            f"{type(cause).__name__}: {cause}).{views} Tensors the model writes in forward (a KV cache) should be "
            "registered buffers of the module that forward reaches as themselves, not as views kept elsewhere; "
            "torch.compile(model, backend='opgen') compiles the model without torch.export."
        )


class _FunctionModule(torch.nn.Module):
    """Lets torch.export capture a plain function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def as_module(model: Any) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    if callable(model):
        return _FunctionModule(model)
    raise TypeError(f"opgen.compile needs an nn.Module or a function, got {type(model).__name__}")


def model_name(model: Any) -> str:
    target = model.fn if isinstance(model, _FunctionModule) else model
    return getattr(target, "__qualname__", None) or type(target).__name__


def describe_inputs(inputs: Sequence[Any]) -> str:
    return ", ".join(
        f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        for t in inputs
    )


def export_program(
    model: torch.nn.Module, inputs: tuple[Any, ...], registry: KernelRegistry, dynamic_shapes: Any = None
) -> ExportedProgram:
    """torch.export the model and decompose it; export's own error passes on, with what opgen was doing.

    One export at a time in a process: torch.export is not thread-safe (two threads exporting one
    module fail with `Unexpected key _export_root.fc1@2`), and compiled functions export on their
    slow path, from whichever threads call them with new shapes.
    """
    with _EXPORT_LOCK, torch_noise_silenced():
        return _export_program(model, inputs, registry, dynamic_shapes)


_EXPORT_LOCK = threading.Lock()  # process-wide by nature: it guards torch's own global tracing state


def _export_program(
    model: torch.nn.Module, inputs: tuple[Any, ...], registry: KernelRegistry, dynamic_shapes: Any
) -> ExportedProgram:
    if dynamic_shapes is not None and isinstance(model, _FunctionModule) and not isinstance(dynamic_shapes, dict):
        dynamic_shapes = (tuple(dynamic_shapes),)  # forward(*args): one entry for the varargs
    decomposed = export_decomposed(model, inputs, decomposition_table(registry), dynamic_shapes)
    if decomposed is not None and is_functional(decomposed.graph):
        return _decompose_uncovered(decomposed, registry)
    try:
        ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        exc.add_note(
            f"opgen.compile: this happened while capturing {model_name(model)} with torch.export.export for inputs "
            f"({describe_inputs(inputs)}). opgen needs a graph torch.export can capture; "
            "torch.compile(model, backend='opgen') handles graph breaks instead."
        )
        raise
    shared = shared_memory(ep)
    ep = buffers_for_written_constants(ep)  # a KV cache held outside the module: see capture/lifted.py
    # triton_op custom ops become the wrap_triton kernel calls inside them, which opgen launches.
    try:
        ep = _run_default_decompositions(ep, registry)
    except Exception as exc:  # torch's own asserts included: they must not reach the user bare
        raise DecompositionError(model_name(model), describe_inputs(inputs), exc, shared) from exc
    return _decompose_uncovered(ep, registry)


def _run_default_decompositions(ep: ExportedProgram, registry: KernelRegistry) -> ExportedProgram:
    """The whole table at once; if that fails, op by op, skipping the decompositions that fail."""
    table = decomposition_table(registry)
    whole = _try_decompose(ep, _run_table, table)  # one decomposition's failure must not sink the others
    if whole is not None:
        return whole  # type: ignore[no-any-return]
    for op in sorted(_graph_ops(ep.graph) & set(table.keys()), key=str):
        candidate = _try_decompose(ep, _run_table, {op: table[op]})
        if candidate is not None:
            ep = candidate
    return _run_table(ep, {})  # the core IR, without the decompositions that failed


def _run_table(ep: ExportedProgram, table: dict[Any, Any]) -> ExportedProgram:
    return ep.run_decompositions(table, decompose_custom_triton_ops=True)


def _graph_ops(graph: torch.fx.Graph) -> set[Any]:
    return {n.target for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def _try_decompose(program: Any, decompose: Callable[[Any, dict[Any, Any]], Any], table: dict[Any, Any]) -> Any:
    """`decompose(program, table)`, or None where it raises or leaves a mutating op in the graph."""
    try:
        candidate = decompose(program, table)
    except Exception:  # torch's decompositions and aot_autograd's asserts raise anything
        return None
    return candidate if is_functional(candidate.graph) else None


def is_functional(graph: torch.fx.Graph) -> bool:
    """No node calls an op that writes its inputs (`prims.copy_to`, `aten.add_`...)."""
    return not any(op._schema.is_mutable for op in _graph_ops(graph))


def uncovered_ops(graph: torch.fx.Graph, registry: KernelRegistry) -> set[Any]:
    return {
        node.target
        for node in graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and registry.lookup(node.target.name()) is None
    }


def decompose_uncovered(program: Any, decompose: Callable[[Any, dict[Any, Any]], Any], registry: KernelRegistry) -> Any:
    """Decompose ops kernel_ops lacks, one at a time, keeping a decomposition only if it needs no new uncovered op.

    `program` is an ExportedProgram or a GraphModule; `decompose(program, table)` applies a table to it.
    """
    table = torch._decomp.decomposition_table
    missing = uncovered_ops(program.graph, registry)
    for op in sorted((op for op in missing if op in table), key=str):
        candidate = _try_decompose(program, decompose, {op: table[op]})
        if candidate is not None and uncovered_ops(candidate.graph, registry) <= missing - {op}:
            program, missing = candidate, missing - {op}
    return program


def _decompose_uncovered(ep: ExportedProgram, registry: KernelRegistry) -> ExportedProgram:
    return decompose_uncovered(ep, lambda p, table: p.run_decompositions(table), registry)  # type: ignore[no-any-return]


def signature_of(ep: ExportedProgram) -> GraphSignature:
    placeholders = []
    arg_of_target = {}
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            placeholders.append(PlaceholderSpec(name, "input"))
        elif spec.kind in _CONSTANT_KINDS:
            placeholders.append(PlaceholderSpec(name, "constant", spec.target))
            arg_of_target[spec.target] = name
        else:
            raise OpgenError(f"opgen cannot bind graph input '{name}' of kind {spec.kind.name}")
    outputs = []
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(OutputSpec("user"))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            outputs.append(OutputSpec("mutation", arg_of_target[spec.target]))
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            outputs.append(OutputSpec("mutation", spec.target))
        else:
            raise OpgenError(f"opgen cannot handle graph output '{spec.arg}' of kind {spec.kind.name}")
    return GraphSignature(tuple(placeholders), tuple(outputs), output_form(ep.call_spec.out_spec))


def output_form(spec: pytree.TreeSpec | None) -> str:
    if spec is None or spec.is_leaf():
        return "single"
    if all(child.is_leaf() for child in spec.children()):
        if spec.type is tuple:
            return "tuple"
        if spec.type is list:
            return "list"
    return "pytree"


def constants_of(model: torch.nn.Module, ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, the model's own tensors where it has them (so writes reach it)."""
    constants: dict[str, torch.Tensor] = {
        **ep.state_dict,
        **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)},
    }
    constants.update(dict(model.named_parameters(remove_duplicate=False)))
    constants.update(dict(model.named_buffers(remove_duplicate=False)))
    return constants | attr_constants(ep.graph_module)


def attr_constants(gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    """Tensors the graph reads with `get_attr`, under the keys lowering gives them."""
    return {f"attr:{n.target}": getattr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"}


def graph_fingerprint(gm: torch.fx.GraphModule) -> str:
    """The graph's code plus every node's meta: what the generated code depends on."""
    metas = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        values = val if isinstance(val, list | tuple) else [val]
        metas.append(node.name + ":" + ";".join(_meta_text(v) for v in values))
    return gm.code + "\n" + "\n".join(metas)


def _meta_text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}{tuple(value.stride())}@{value.device}+{value.storage_offset()}"
    return repr(value)
