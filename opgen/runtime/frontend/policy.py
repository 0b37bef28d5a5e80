"""How `opgen.compile` treats one model's calls: which inputs compile what, and what a call that fits
no compiled version does (`CompilePolicy`); the versions themselves are in `specializations`.

A build exports the model for the inputs, compiles the graph (one function per size class where
the pass pipeline splits a dynamic range) and binds each through the entry points' one bind path
(`frontend.bind`). A call whose inputs fit no version reaches the slow path: grad mode with
parameters that require grad runs eagerly (fallback) or raises; inputs a dynamic version takes go
there; inputs that need other shapes compile a new version under the lock (automatic dynamic
first, then static; `recompile=False` makes it an error); anything else is an error naming the input.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.capture.export import constants_of, export_program, model_name, signature_of
from opgen.runtime.errors import InputMismatchError, RequiresGradError, warn
from opgen.runtime.execution import executor
from opgen.runtime.execution.automatic import Dynamic
from opgen.runtime.execution.cuda_graphs import CudaGraphs, GraphStatus
from opgen.runtime.execution.dynamic_guards import explain, input_check, is_dynamic
from opgen.runtime.execution.guards import PROCEED, Check, InputSpec, diagnose, shape_mismatch_message
from opgen.runtime.execution.size_classes import sub_ranges
from opgen.runtime.frontend.bind import bind
from opgen.runtime.frontend.inputs import unflattener
from opgen.runtime.frontend.specializations import Compiled, Specializations
from opgen.runtime.ir.sizes import SizeRange
from opgen.runtime.lowering.symbolic import graph_symbols, ranges_of
from opgen.runtime.pipeline import CompileOptions, compile_graph, default_registry, start_jit_workers
from opgen.runtime.report import Report, jit_lines


@dataclass(frozen=True, slots=True)
class Exported:
    """What every function compiled from one export binds."""

    constants: dict[str, torch.Tensor]
    unflatten: Callable[[tuple[Any, ...]], Any] | None
    grad_mode: bool
    export_seconds: float


@dataclass
class CompilePolicy:
    """One compiled model: its options, its versions, and what a call that fits none of them does."""

    module: torch.nn.Module
    options: CompileOptions
    recompile: bool
    graphs: CudaGraphs | None = None
    dynamic: Dynamic = field(default_factory=lambda: Dynamic(None, False))
    versions: Specializations = field(default_factory=Specializations)
    warned_eager: bool = False

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
            self.versions.extra_classes += len(parts) - 1
        unflatten = unflattener(spec) if sig.form == "pytree" else None
        bound = Exported(constants, unflatten, grad_mode, export_seconds)
        fns = [self.bind(graph, filename, bound, inputs, tuple(ranges)) for graph, filename in parts]
        self.dynamic.seen(inputs)
        return next((fn for fn in fns if self.versions.find(inputs) is fn), fns[0])

    def bind(
        self, graph: CompiledGraph, filename: str, bound: Exported, inputs: tuple[torch.Tensor, ...], whole: Any
    ) -> Compiled:
        handler = self.slow_path(graph.inputs, graph.size_ranges, bound.grad_mode, whole)
        b = bind(
            graph, bound.constants, handler, filename,
            backend=self.options.backend, unflatten=bound.unflatten, graphs=self.graphs,
        )  # fmt: skip
        fn, status = b.fn, b.status
        fn.report = lambda: self.report(graph, bound.export_seconds, status, b.jit, b.backend_line)  # type: ignore[attr-defined]
        if is_dynamic(graph.inputs):
            self.versions.add_ranged(input_check(graph.inputs, graph.size_ranges), fn, graph.inputs)
        else:
            self.versions.add_static(inputs, fn)
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
            specializations=self.versions.count(),
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
            if (fn := self.versions.find_ranged(args, specs)) is not None:  # a dynamic one takes them: no compile
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
            warn(
                f"opgen: {what} requires grad and grad mode is on; running eagerly (this warning is given once). "
                "Call it under torch.no_grad() or torch.inference_mode() to run it compiled"
            )
            self.warned_eager = True
        return self.module(*args)

    def respecialize(
        self, specs: tuple[InputSpec, ...], ranges: tuple[SizeRange, ...], args: tuple[torch.Tensor, ...]
    ) -> Any:
        with self.versions.lock:  # threads that bring the same new shapes at once compile it once
            fn = self._specialization(specs, ranges, args)
        return fn(*args)

    def _specialization(
        self, specs: tuple[InputSpec, ...], ranges: tuple[SizeRange, ...], args: tuple[torch.Tensor, ...]
    ) -> Compiled:
        fn = self.versions.find(args)
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
            if (found := self.versions.find(args)) is not None:  # this function, or one of its size classes
                return found
        return self.build(args, self.dynamic.explicit)
