"""Export and decomposition in one trace, where this torch allows it.

`torch.export.export` traces the model to the training IR (pre-dispatch ATen), and
`ExportedProgram.run_decompositions` then traces that graph again, through aot_autograd, to
decompose it: every node is traced twice (a 12-layer Qwen2 on this project's CPU machine: 1.7 s of
export, then 2.4 s of decomposition). torch's export can also trace the model straight to the ATen IR,
the path it took before the training IR (`torch.export._trace._export(..., pre_dispatch=False)`),
and that trace goes through the same aot_autograd, which applies a decomposition table as it
traces: one trace (2.5 s), the same ops.

These are torch's private functions, and the table reaches that trace only by wrapping
`_export_to_aten_ir`, which `_export` looks up when it runs. Where one is missing, or the trace
raises (a KV cache held outside the module, which the two-trace path rewrites between its traces),
`export_decomposed` returns None and the caller takes the public path.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.export import ExportedProgram


def export_decomposed(
    model: torch.nn.Module, inputs: tuple[Any, ...], table: Any, dynamic_shapes: Any
) -> ExportedProgram | None:
    """The model exported to the ATen IR with `table` applied, or None where this torch cannot do it here.

    The caller holds the process's export lock: the wrapper is torch's module state while it runs.
    """
    try:
        from torch.export import _trace
        from torch.export.exported_program import (
            _override_composite_implicit_decomp,
            _split_decomp_table_to_cia_and_python_decomp,
        )
    except ImportError:
        return None
    to_aten = getattr(_trace, "_export_to_aten_ir", None)
    if to_aten is None or not {"decomp_table", "decompose_custom_triton_ops"} <= set(
        inspect.signature(to_aten).parameters
    ):
        return None
    composite, python = _split_decomp_table_to_cia_and_python_decomp(table)

    def decomposing(*args: Any, **kwargs: Any) -> Any:
        return to_aten(*args, **kwargs, decomp_table=python, decompose_custom_triton_ops=True)

    _trace._export_to_aten_ir = decomposing
    try:
        with _override_composite_implicit_decomp(composite):
            return _trace._export(model, inputs, dynamic_shapes=dynamic_shapes, strict=False, pre_dispatch=False)
    except Exception:  # anything torch's trace raises: the two-trace path runs, and raises what the user must see
        return None
    finally:
        _trace._export_to_aten_ir = to_aten
