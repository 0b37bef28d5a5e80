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

import dataclasses
import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.capture.export import as_module, constants_of, export_program, model_name, signature_of
from opgen.runtime.errors import InputMismatchError, InputTypeError, OpgenWarning, RequiresGradError
from opgen.runtime.execution import executor
from opgen.runtime.execution.automatic import Dynamic as _Dynamic
from opgen.runtime.execution.cpp_executor import bind_cpp, check_backend, with_backend
from opgen.runtime.execution.cuda_graphs import CudaGraphs, GraphOptions, GraphStatus
from opgen.runtime.execution.dynamic_guards import explain, input_check, is_dynamic
from opgen.runtime.execution.guards import PROCEED, Check, InputSpec, diagnose, shape_mismatch_message, signature
from opgen.runtime.execution.size_classes import sub_ranges
from opgen.runtime.ir.sizes import SizeRange
from opgen.runtime.lowering.symbolic import graph_symbols, ranges_of
from opgen.runtime.pipeline import (
    CompileOptions,
    compile_graph,
    default_pipeline,
    default_registry,
    kernel_ops_module,
    start_jit_workers,
)
from opgen.runtime.report import Report, jit_lines

Compiled = Callable[..., Any]


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
        Default: on, except with cuda_graphs (a dynamic graph cannot be captured, so each size gets
        its own captured specialization instead).
    backend: "auto" (the default) runs the program on opgen's prebuilt C++ executor where it can run
        there, else the generated Python (a line in `report()` says which and why); "cpp" is "auto"
        with one OpgenWarning where the program stays Python; "python" always runs the generated Python.
    """
    if static_outputs and not cuda_graphs:
        raise ValueError("opgen.compile: static_outputs=True needs cuda_graphs=True")
    inputs = _example_inputs(example_inputs)
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
    dynamic = _Dynamic(dynamic_shapes, automatic_dynamic and dynamic_shapes is None)
    return _Specializations(module, options, recompile, graphs, dynamic).build(inputs, dynamic_shapes)


def _example_inputs(example_inputs: Iterable[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    inputs = tuple(example_inputs)
    for i, value in enumerate(inputs, start=1):
        if not isinstance(value, torch.Tensor):
            raise InputTypeError(
                f"opgen.compile: example input {i} is {type(value).__name__}; the compiled function takes tensors only "
                "(bind other arguments inside the model)"
            )
    return inputs


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
    warnings.warn(
        f"opgen.compile: {reason}; running {model_name(module)} eagerly (fallback=True). To run it compiled, "
        "compile and call it under torch.no_grad() or torch.inference_mode(), or call model.requires_grad_(False)",
        OpgenWarning,
        stacklevel=3,
    )

    def eager(*args: Any) -> Any:
        return module(*args)

    eager.report = lambda: Report(model_name(module), 0, (), eager_reason=reason)  # type: ignore[attr-defined]
    return eager


@dataclass(frozen=True, slots=True)
class _Bound:
    """What every function compiled from one export binds."""

    constants: dict[str, torch.Tensor]
    unflatten: Callable[[tuple[Any, ...]], Any] | None
    grad_mode: bool
    export_seconds: float


@dataclass
class _Specializations:
    """The compiled versions of one model, by input signature, and the slow path between them."""

    module: torch.nn.Module
    options: CompileOptions
    recompile: bool
    graphs: CudaGraphs | None = None
    dynamic: _Dynamic = field(default_factory=lambda: _Dynamic(None, False))
    by_signature: dict[Any, Compiled] = field(default_factory=dict)
    ranged: list[tuple[Check, Compiled, Any]] = field(default_factory=list)  # dynamic ones: (check, fn, specs)
    extra_classes: int = 0  # ranged functions beyond the first of each compile (size classes)
    warned_eager: bool = False
    lock: Any = field(default_factory=threading.RLock, repr=False)  # guards by_signature and compiling

    def build(self, inputs: tuple[torch.Tensor, ...], dynamic_shapes: Any = None) -> Compiled:
        start = time.perf_counter()
        start_jit_workers(self.options.passes, inputs)
        ep = export_program(self.module, inputs, default_registry(), dynamic_shapes)
        export_seconds = time.perf_counter() - start
        ranges = ranges_of(ep.range_constraints, graph_symbols(ep.graph_module))
        sig = signature_of(ep)
        constants = constants_of(self.module, ep)
        grad_mode = any(constants[p.key].requires_grad for p in sig.placeholders if p.kind == "constant" and p.key)
        options = dataclasses.replace(self.options, guard=True, grad_mode=grad_mode)
        spec = ep.call_spec.out_spec
        compile_ = functools.partial(compile_graph, ep.graph_module, sig, options, model_name(self.module), str(spec))
        parts = [compile_(ranges)]
        classes = sub_ranges(ranges, parts[0][0].splits)
        if len(classes) > 1:  # one function per size class (size_classes), none for the whole range
            parts = [compile_(sub) for sub in classes]
            self.extra_classes += len(parts) - 1
        unflatten = _unflatten(spec) if sig.form == "pytree" else None
        bound = _Bound(constants, unflatten, grad_mode, export_seconds)
        fns = [self.bind(graph, filename, bound, inputs, tuple(ranges)) for graph, filename in parts]
        self.dynamic.seen(inputs)
        return next((fn for fn in fns if self._existing(inputs) is fn), fns[0])

    def bind(
        self, graph: CompiledGraph, filename: str, bound: _Bound, inputs: tuple[torch.Tensor, ...], whole: Any
    ) -> Compiled:
        handler = self.slow_path(graph.inputs, graph.size_ranges, bound.grad_mode, whole)
        rt = executor.Runtime(handler, unflatten=bound.unflatten)
        fn = executor.bind(graph, bound.constants, rt, kernel_ops_module(), filename)
        cpp = functools.partial(bind_cpp, graph, bound.constants, rt.on_mismatch, bound.unflatten, jit=rt.jit)
        fn, backend_line = with_backend(self.options.backend, graph, fn, cpp)
        if self.graphs is not None:
            fn = self.graphs.wrap(fn, graph, bound.constants)
        fn.artifact = graph  # type: ignore[attr-defined]
        status = getattr(fn, "graph_status", None)
        fn.report = lambda: self.report(graph, bound.export_seconds, status, rt.jit, backend_line)  # type: ignore[attr-defined]
        if is_dynamic(graph.inputs):
            self.ranged.append((input_check(graph.inputs, graph.size_ranges), fn, graph.inputs))
        else:
            self.by_signature[signature(inputs)] = fn
        return fn

    def report(
        self,
        graph: CompiledGraph,
        export_seconds: float,
        status: GraphStatus | None,
        jit: Any = None,
        backend_line: str = "",
    ) -> Report:
        return Report(
            model_name(self.module),
            graph.direct_nodes,
            graph.fallback_nodes,
            torch_ops=tuple(op for op in graph.fallbacks if op not in {f for _, f in graph.fallback_nodes}),
            from_cache=graph.from_cache,
            export_seconds=export_seconds,
            codegen_seconds=graph.codegen_seconds,
            specializations=len(self.by_signature) + len(self.ranged) - self.extra_classes,
            cuda_graph=status.line() if status is not None else None,
            ranges=tuple(f"{s}: {SizeRange(s, lo, hi).text()}" for s, lo, hi in graph.ranges),
            notes=graph.notes + ((backend_line,) if backend_line else ()),
            jit=jit_lines(graph, jit or {}),
        )

    def slow_path(
        self, specs: tuple[InputSpec, ...], ranges: tuple[SizeRange, ...], grad_mode: bool, whole: Any = None
    ) -> executor.Handler:
        """`whole`: the range the compile was asked for, where `ranges` is one size class of it (for messages)."""

        def on_mismatch(set_check: Callable[[Check], None], *args: Any) -> Any:
            if grad_mode and torch.is_grad_enabled():
                return self.run_eagerly(args)
            for check, fn, own in self.ranged:  # a dynamic specialization takes these sizes: no lock, no compile
                if own is not specs and check(*args):
                    return fn(*args)
            new_shapes = diagnose(specs, args)
            if is_dynamic(specs):
                new_shapes = explain(specs, ranges, args) is not None
            if new_shapes:
                return self.respecialize(specs, whole or ranges, args)
            set_check(input_check(specs, ranges))  # the inputs fit: the first call, or a check built before they did
            return PROCEED

        return on_mismatch

    def run_eagerly(self, args: tuple[Any, ...]) -> Any:
        what = f"a parameter of {model_name(self.module)}"
        if not self.options.fallback:
            raise RequiresGradError(what)
        if not self.warned_eager:
            warnings.warn(
                f"opgen: {what} requires grad and grad mode is on; running eagerly (this warning is given once). "
                "Call it under torch.no_grad() or torch.inference_mode() to run it compiled",
                OpgenWarning,
                stacklevel=3,
            )
            self.warned_eager = True
        return self.module(*args)

    def respecialize(
        self, specs: tuple[InputSpec, ...], ranges: tuple[SizeRange, ...], args: tuple[torch.Tensor, ...]
    ) -> Any:
        with self.lock:  # threads that bring the same new shapes at once compile it once
            fn = self._specialization(specs, ranges, args)
        return fn(*args)

    def _existing(self, args: tuple[torch.Tensor, ...]) -> Compiled | None:
        fn = self.by_signature.get(signature(args))
        return fn or next((f for check, f, _ in self.ranged if check(*args)), None)

    def _specialization(
        self, specs: tuple[InputSpec, ...], ranges: tuple[SizeRange, ...], args: tuple[torch.Tensor, ...]
    ) -> Compiled:
        fn = self._existing(args)
        if fn is not None:
            return fn
        dynamic = is_dynamic(specs)
        message = (explain(specs, ranges, args) if dynamic else None) or shape_mismatch_message(specs, args)
        if self.dynamic.explicit is not None and "outside the compiled range" in message:
            raise InputMismatchError(f"{message} (the range opgen.compile(..., dynamic_shapes=...) was given)")
        if not self.recompile:
            raise InputMismatchError(f"{message}; recompiling is off (opgen.compile(..., recompile=False))")
        try:
            return self._compile_for(args)
        except Exception as exc:
            raise InputMismatchError(
                f"{message}; compiling for the new shapes failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _compile_for(self, args: tuple[torch.Tensor, ...]) -> Compiled:
        """A dynamic specialization where automatic dynamic applies and takes these sizes, else a static one."""
        for shapes in self.dynamic.candidates(args, self.module):
            try:
                self.build(self.dynamic.example(args), shapes)
            except Exception:  # noqa: S112 - export refuses these dims dynamic (hard Dim): the next, then static
                continue
            if (found := self._existing(args)) is not None:  # this function, or one of its size classes
                return found
        return self.build(args, self.dynamic.explicit)


def _unflatten(spec: pytree.TreeSpec) -> Callable[[tuple[Any, ...]], Any]:
    return lambda flat: pytree.tree_unflatten(list(flat), spec)
