"""Lifted tensors torch.export captures in a form its own `run_decompositions` cannot retrace.

A KV cache kept in an object that is not a module (transformers' `StaticCache`, whose layers hold
the tensors) reaches a non-strict export as lifted constants, and the graph writes them in place
(`index_copy_`, `index_put_`, `copy_` into a slice). Two things then break the retrace:

- The same tensor is also a registered buffer (transformers' `TorchExportableModuleWithStaticCache`
  registers each cache tensor as `key_cache_{i}`): the graph takes one tensor twice, as a buffer and
  as a constant; aot_autograd deduplicates the two inputs with a runtime wrapper, and export's
  stage 2, which expects a bare graph, fails with `AssertionError: expected compiled_fn to be
  GraphModule, got <class 'function'>`.
- The constant is written: torch functionalizes the write into a buffer mutation, then refuses it
  (`Constant lifted_tensor_0 is mutated in the forward method. Pls register it as buffer`).

`buffers_for_written_constants` rewrites the exported program before decomposition: a constant that is
the very tensor of a parameter or buffer reads that input instead, and a constant the graph writes
becomes a non-persistent buffer (the form export gives `register_buffer(..., persistent=False)`),
so the retrace turns its writes into buffer-mutation outputs like any module buffer's. The tensor
stays the one the model holds, so compiled writes land where eager's do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec
from torch.multiprocessing.reductions import StorageWeakRef

_LIFTED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
_KIND_WORDS = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer", InputKind.CONSTANT_TENSOR: "constant"}


def buffers_for_written_constants(ep: ExportedProgram) -> ExportedProgram:
    """`ep` with constants that alias a parameter/buffer merged into it, and written constants as buffers.

    Consumes `ep`: its graph is rewritten in place (the program returned shares it).
    """
    specs = list(ep.graph_signature.input_specs)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    merged = _merge_aliases(ep, specs, placeholders)
    written = _written_storages(ep.graph)
    relabelled = False
    for i, spec in enumerate(specs):
        if spec.kind == InputKind.CONSTANT_TENSOR and _storage(placeholders[spec.arg.name]) in written:
            specs[i] = InputSpec(InputKind.BUFFER, spec.arg, spec.target, persistent=False)
            relabelled = True
    if not merged and not relabelled:
        return ep
    ep.graph_module.recompile()
    used = {s.target for s in specs}
    constants = {k: v for k, v in ep.constants.items() if k in used or not isinstance(v, torch.Tensor)}
    signature = ExportGraphSignature(specs, list(ep.graph_signature.output_specs))
    return ep._update(ep.graph_module, signature, constants=constants)


def _merge_aliases(ep: ExportedProgram, specs: list[InputSpec], placeholders: dict[str, torch.fx.Node]) -> bool:
    """Constants that are the same tensor object as a parameter, buffer or earlier constant read that input."""
    keeper: dict[int, InputSpec] = {}
    dropped: list[InputSpec] = []
    for spec in sorted(specs, key=lambda s: s.kind == InputKind.CONSTANT_TENSOR):  # parameters and buffers keep
        tensor = _lifted_tensor(ep, spec)
        if tensor is None:
            continue
        first = keeper.setdefault(id(tensor), spec)
        if first is not spec and spec.kind == InputKind.CONSTANT_TENSOR:
            node = placeholders.pop(spec.arg.name)
            node.replace_all_uses_with(placeholders[first.arg.name])
            ep.graph.erase_node(node)
            dropped.append(spec)
    specs[:] = [s for s in specs if all(s is not d for d in dropped)]
    return bool(dropped)


def shared_memory(ep: ExportedProgram) -> tuple[str, ...]:
    """Lifted inputs that share memory without being one tensor (a view of a buffer held elsewhere), by group."""
    groups: dict[int, dict[int, str]] = {}  # storage -> tensor object -> the first input naming it
    for spec in ep.graph_signature.input_specs:
        tensor = _lifted_tensor(ep, spec)
        if tensor is not None and tensor.numel() > 0:
            group = groups.setdefault(tensor.untyped_storage().data_ptr(), {})
            group.setdefault(id(tensor), f"{_KIND_WORDS[spec.kind]} '{spec.target}'")
    return tuple(" and ".join(names.values()) for names in groups.values() if len(names) > 1)


def _lifted_tensor(ep: ExportedProgram, spec: InputSpec) -> torch.Tensor | None:
    if spec.kind not in _LIFTED or spec.target is None:
        return None
    value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
    return value if isinstance(value, torch.Tensor) else None


def _written_storages(graph: torch.fx.Graph) -> set[Any]:
    """The storages of every tensor an op in the graph writes (`Tensor(a!)` arguments), views included."""
    written: set[Any] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for i, arg in enumerate(node.target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            for item in value if isinstance(value, list | tuple) else (value,):
                if isinstance(item, torch.fx.Node) and (storage := _storage(item)) is not None:
                    written.add(storage)
    return written


def _storage(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None
