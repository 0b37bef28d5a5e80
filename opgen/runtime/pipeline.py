"""One FX graph -> one `CompiledGraph`: cache lookup, lowering, passes, the generated Python, and
the programs of the other backends the compile may run on (`opgen.runtime.backends`).

Shared by `opgen.compile` (export graphs), the torch.compile backend (AOT graphs) and packages.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from opgen import extensions
from opgen.runtime import extension_registry
from opgen.runtime.artifact import cache
from opgen.runtime.artifact.compiled import CompiledGraph, compiled_graph
from opgen.runtime.backends import print_programs
from opgen.runtime.capture.export import graph_fingerprint
from opgen.runtime.codegen.python import emit
from opgen.runtime.codegen.triton.kernels import print_kernels
from opgen.runtime.execution.device_facts import device_facts
from opgen.runtime.ir import Program
from opgen.runtime.ir.signature import GraphSignature
from opgen.runtime.ir.sizes import SizeRange
from opgen.runtime.lowering.collectives import group_sizes
from opgen.runtime.lowering.lower import LowerOptions, lower
from opgen.runtime.passes import DEFAULT_PIPELINE, JIT_PASSES, run_passes
from opgen.runtime.passes.analysis import written_names
from opgen.runtime.passes.relabel import relabel
from opgen.runtime.registry import KernelRegistry, load_registry


def default_pipeline() -> tuple[str, ...]:
    """All passes, less `prepack`/`onednn` where torch lacks the oneDNN ops they call, `mkl_linear` where
    it lacks MKL's, `cudnn` where it lacks cuDNN, and the passes that make or launch Triton kernels
    (`passes.JIT_PASSES`) where opgen's JIT cannot run (no CUDA build, GPU or triton)."""
    has_onednn = torch.backends.mkldnn.is_available()
    missing: set[str] = set()
    if not (has_onednn and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        missing.add("prepack")
    if not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")):
        missing.add("mkl_linear")
    if not (has_onednn and hasattr(torch.ops.mkldnn, "_convolution_pointwise")):
        missing.add("onednn")
    if not torch.backends.cudnn.is_available():
        missing.add("cudnn")
    if not _jit_available():
        missing.update(JIT_PASSES)
    return tuple(p for p in DEFAULT_PIPELINE if p not in missing)


def _jit_available() -> bool:
    from opgen.jit.env import available

    return bool(available())


def start_jit_workers(passes: Sequence[str], inputs: Sequence[Any]) -> None:
    """Start Triton's compile workers (`opgen.jit.workers`) where this compile will make Triton kernels
    (a JIT pass runs, on CUDA inputs), so that they start during the export, not on the first call."""
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    if on_cuda and JIT_PASSES.intersection(passes) and _jit_available():
        from opgen.jit import workers

        workers.warm()


@dataclass(frozen=True, slots=True)
class CompileOptions:
    fallback: bool = False
    passes: tuple[str, ...] = DEFAULT_PIPELINE
    cache: bool = True
    guard: bool = True  # check inputs at the top (off under torch.compile: Dynamo guards already)
    grad_mode: bool = False  # the check also refuses grad mode (bound constants require grad)
    backend: str = "python"  # also print the programs of the backends it may run on (`opgen.runtime.backends`)


def default_registry() -> KernelRegistry:
    """kernel_ops' registry, with the extensions imported so far beside it (`opgen.extensions`)."""
    return _registry(extensions.registered())


@functools.cache
def _registry(modules: tuple[ModuleType, ...]) -> KernelRegistry:
    from opgen import _C, kernel_ops

    base = dataclasses.replace(load_registry(kernel_ops), facts=device_facts())
    if not modules:
        return base
    extension_registry.register_thunks(_C, modules)
    return extension_registry.merged(base, modules)


def kernel_ops_module() -> object:
    """What generated code binds its kernels from: kernel_ops, and the imported extensions' functions."""
    return _kernels(extensions.registered())


@functools.cache
def _kernels(modules: tuple[ModuleType, ...]) -> object:
    from opgen import kernel_ops

    return extension_registry.kernels(kernel_ops, modules)


def compile_graph(
    gm: torch.fx.GraphModule,
    signature: GraphSignature,
    options: CompileOptions,
    name: str,
    out_spec: str = "",
    ranges: Sequence[SizeRange] = (),
) -> tuple[CompiledGraph, str]:
    """The compiled graph and the file name its source is registered under; `out_spec` joins the key.

    `ranges`: the ranges of the graph's size symbols (dynamic shapes); they join the key too.
    """
    registry = default_registry()
    parts = [torch.__version__, registry.build_id, repr(options), repr(signature), out_spec, graph_fingerprint(gm)]
    parts.append(repr(tuple(ranges)))
    parts.append(repr(group_sizes(gm)))  # a graph of collectives is compiled per size of its groups
    parts.append(repr(registry.facts))  # passes decide by them: another GPU may get another program
    key = cache.cache_key(parts)
    if options.cache and (graph := cache.load(key)) is not None:
        return graph, str(cache.source_path(key))
    start = time.perf_counter()
    lowered = lower(gm, signature, registry, LowerOptions(options.fallback, options.guard, options.grad_mode))
    size_ranges = tuple((r.symbol, r.low, r.high) for r in ranges)
    program = run_passes(dataclasses.replace(lowered.program, ranges=size_ranges), registry, options.passes)
    program = print_kernels(program)  # the Triton source of each kernel the passes planned
    source = emit(program, header=f"{name}, graph {key[:16]}")
    printed = print_programs(program, registry, f"{name}, graph {key[:16]}", options.backend)
    graph = compiled_graph(
        key,
        program,
        source,
        written=written_names(program, registry),
        direct_nodes=lowered.direct,
        fallback_nodes=lowered.fallbacks,
        passes=options.passes,
        codegen_seconds=time.perf_counter() - start,
        ranges=size_ranges,
        printed=printed,
    )
    path = cache.store(graph) if options.cache and graph.cacheable else None
    return graph, str(path) if path is not None else f"<opgen:{key[:16]}>"


def plan_program(gm: torch.fx.GraphModule, signature: GraphSignature, passes: Sequence[str], device: str) -> Program:
    """The program `passes` make of the graph for `device` ("cuda:0"), planned on this machine, which may lack
    it: the lowered program's tensors are relabelled onto `device` for the passes, then back to the CPU, and
    its kernels printed. For reading (`python -m opgen.bench plan`), never for running: nothing is bound,
    timed or cached, and where a pass asks this machine's device facts (dependent launch), a CPU's answer."""
    registry = default_registry()
    lowered = lower(gm, signature, registry, LowerOptions())
    return print_kernels(relabel(run_passes(relabel(lowered.program, device), registry, passes), "cpu"))
