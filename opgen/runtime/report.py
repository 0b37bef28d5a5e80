"""What `compiled.report()` returns: how the graph runs, node by node counts, and any fallbacks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Report:
    model: str
    direct: int  # graph nodes that call kernel_ops
    fallbacks: tuple[tuple[str, str], ...]  # (node, ATen op) of nodes that call the ATen op
    torch_ops: tuple[str, ...] = ()  # other torch ops the code calls, chosen by passes (oneDNN linear)
    eager_reason: str | None = None  # set when the whole model runs eagerly instead
    from_cache: bool = False
    export_seconds: float = 0.0
    codegen_seconds: float = 0.0
    specializations: int = 1
    cuda_graph: str | None = None  # how CUDA-graph mode runs this specialization, when asked for
    ranges: tuple[str, ...] = ()  # dynamic shapes: "s27: [1, 256]" per size symbol
    notes: tuple[str, ...] = ()  # what passes did differently for symbolic sizes
    jit: tuple[str, ...] = ()  # per Triton kernel node and fused group: the kernel, and which runs and why

    @property
    def runs_eagerly(self) -> bool:
        return self.eager_reason is not None

    def __str__(self) -> str:
        if self.eager_reason is not None:
            return f"opgen report for {self.model}: runs eagerly (not compiled): {self.eager_reason}"
        total = self.direct + len(self.fallbacks)
        source = "loaded from the disk cache" if self.from_cache else f"codegen {self.codegen_seconds * 1e3:.0f} ms"
        lines = [
            f"opgen report for {self.model}: {total} graph nodes (export {self.export_seconds:.2f} s, {source})",
            f"  direct through kernel_ops: {self.direct}",
            f"  fallback to the ATen op:   {len(self.fallbacks)}",
        ]
        lines += [f"    node '{node}': {op}" for node, op in self.fallbacks]
        if self.fallbacks:
            lines.append("  (add these ops to ops.yaml to run them direct)")
        if self.torch_ops:
            lines.append(f"  also calls through torch.ops, chosen by passes: {', '.join(self.torch_ops)}")
        if self.ranges:
            lines.append(f"  dynamic sizes: {', '.join(self.ranges)}")
        lines += [f"  {note}" for note in self.notes]
        if self.jit:
            lines.append(f"  Triton kernels and kernel choices through opgen's JIT: {len(self.jit)}")
            lines += [f"    {line}" for line in self.jit]
        if self.cuda_graph is not None:
            lines.append(f"  {self.cuda_graph}")
        if self.specializations > 1:
            lines.append(f"  specializations for input shapes so far: {self.specializations}")
        return "\n".join(lines)


def jit_lines(graph: Any, launchers: Mapping[str, Any]) -> tuple[str, ...]:
    """One line per Triton kernel node of a compiled graph: kernel, configs, and the pick so far."""
    lines = []
    for spec in graph.jit_kernels:
        kernel = getattr(launchers.get(spec.local), "kernel", None)
        picks = "; ".join(kernel.picks.values()) if kernel is not None and kernel.picks else "not called yet"
        lines.append(f"node '{spec.node}': {spec.kernel}, {len(spec.configs)} config(s): {picks}")
    for fused in getattr(graph, "fused", ()):
        binding = launchers.get(fused.local)
        told = binding.describe() if hasattr(binding, "describe") else f"{fused.heading}: not bound"
        lines.append(f"fused {told}")
    for choice_spec in graph.choices:
        choice = getattr(launchers.get(choice_spec.local), "choice", None)
        told = choice.describe() if choice is not None else f"node '{choice_spec.node}': not bound"
        lines.append(f"choice among {', '.join(choice_spec.candidates)}: {told}")
    return tuple(lines)
