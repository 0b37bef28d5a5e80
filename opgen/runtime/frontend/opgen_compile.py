"""`opgen.compile(model, example_inputs)`: export, lower, and return the generated function itself.

The returned callable is the generated Python function (no wrapper object, no Dynamo): it checks
its inputs and runs the kernels. It carries `report()` and `artifact`. Inputs with other sizes or
strides get their own specialization (compiled on first sight, unless `recompile=False`); inputs
of another dtype, device or rank are an error naming the input.

Dynamic shapes: `dynamic_shapes=` (torch.export's, e.g. `Dim` objects with bounds) compiles one
function for the whole range; a size outside it is an `InputMismatchError` naming the input, the
dimension and the range. Without it, the first call whose sizes differ from the compiled ones
compiles the differing dimensions as dynamic (`automatic_dynamic=True`, as torch.compile does),
so later sizes compile nothing; sizes that still do not fit (1 where export keeps a dimension at
2 or more) get a static specialization of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from opgen.runtime.backends import check_backend
from opgen.runtime.capture.export import as_module, model_name
from opgen.runtime.errors import RequiresGradError, warn
from opgen.runtime.execution.automatic import Dynamic
from opgen.runtime.execution.cuda_graphs import CudaGraphs, GraphOptions
from opgen.runtime.frontend.inputs import example_tensors
from opgen.runtime.frontend.policy import CompilePolicy
from opgen.runtime.frontend.specializations import Compiled
from opgen.runtime.pipeline import CompileOptions, default_pipeline
from opgen.runtime.report import Report


def compile(
    model: Any,
    example_inputs: Iterable[torch.Tensor],
    *,
    fallback: bool = False,
    recompile: bool = True,
    passes: Sequence[str] | None = None,
    cache: bool = True,
    cuda_graphs: bool = False,
    static_outputs: bool = False,
    dynamic_shapes: Any = None,
    automatic_dynamic: bool | None = None,
    backend: str = "auto",
) -> Compiled:
    """Compile `model` for inputs like `example_inputs` into a function calling kernel_ops' kernels.

    fallback: ops kernel_ops lacks call the ATen op (see `report()`), and a model that needs
        autograd runs eagerly, with a warning, instead of raising.
    recompile: inputs with new sizes/strides compile a new specialization; False makes them an error.
    passes: IR passes to run (default: `opgen.runtime.pipeline.default_pipeline()`; see `passes.PASSES`).
    cache: read and write compiled graphs under OPGEN_CACHE_DIR (default ~/.cache/opgen).
    cuda_graphs: capture each specialization into a CUDA graph on its first call and replay it
        afterwards (see `opgen.runtime.execution.cuda_graphs`); graphs that cannot be captured run plain, with
        a warning and a line in `report()`.
    static_outputs: with cuda_graphs, return the graph's own output buffers instead of fresh
        tensors: no copy, but the next call overwrites them.
    dynamic_shapes: torch.export's dynamic_shapes for the inputs; one function serves the ranges.
    automatic_dynamic: recompile dimensions whose size changed as dynamic (False: specialize every size).
        Default: on, except with cuda_graphs (each size then gets its own static specialization,
        captured; a dynamic graph, from dynamic_shapes, is captured once per set of sizes).
    backend: "auto" (the default) runs the program on opgen's prebuilt C++ executor where it can run
        there, else the generated Python (a line in `report()` says which and why); "cpp" is "auto"
        with one OpgenWarning where the program stays Python; "python" always runs the generated Python.
    """
    if static_outputs and not cuda_graphs:
        raise ValueError("opgen.compile: static_outputs=True needs cuda_graphs=True")
    why = "the compiled function takes tensors only (bind other arguments inside the model)"
    inputs = example_tensors(example_inputs, "opgen.compile", why)
    module = as_module(model)
    reason = _needs_grad(module, inputs)
    if reason is not None:
        if not fallback:
            raise RequiresGradError(reason)
        return _eager(module, f"{reason} requires grad")
    check_backend(backend, "opgen.compile")
    passes = tuple(passes) if passes is not None else default_pipeline()
    options = CompileOptions(fallback, passes, cache, backend=backend)
    graphs = CudaGraphs(GraphOptions(static_outputs), model_name(module)) if cuda_graphs else None
    if automatic_dynamic is None:
        automatic_dynamic = not cuda_graphs
    dynamic = Dynamic(dynamic_shapes, automatic_dynamic and dynamic_shapes is None)
    return CompilePolicy(module, options, recompile, graphs, dynamic).build(inputs, dynamic_shapes)


def _needs_grad(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> str | None:
    if not torch.is_grad_enabled():
        return None
    for name, param in module.named_parameters():
        if param.requires_grad:
            return f"parameter '{name}' of {model_name(module)}"
    for i, value in enumerate(inputs, start=1):
        if value.requires_grad:
            return f"example input {i}"
    return None


def _eager(module: torch.nn.Module, reason: str) -> Compiled:
    warn(
        f"opgen.compile: {reason}; running {model_name(module)} eagerly (fallback=True). To run it compiled, "
        "compile and call it under torch.no_grad() or torch.inference_mode(), or call model.requires_grad_(False)"
    )

    def eager(*args: Any) -> Any:
        return module(*args)

    eager.report = lambda: Report(model_name(module), 0, (), eager_reason=reason)  # type: ignore[attr-defined]
    return eager
