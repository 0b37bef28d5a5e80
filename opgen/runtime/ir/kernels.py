"""The IR's records of kernels a program launches beyond kernel_ops: user Triton kernels, kernel
choices and fused kernels. Plain data, like the rest of `opgen.runtime.ir` (which re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opgen.runtime.ir import Arg, KernelCall, Value


@dataclass(frozen=True, slots=True)
class JitKernelSpec:
    """A Triton kernel the program launches: what the executor needs to build its launcher."""

    local: str  # the name generated code calls it by
    kernel: str  # "module:qualname" of the @triton.jit function
    params: tuple[str, ...]  # its runtime parameters, in order
    configs: tuple[tuple[tuple[tuple[str, Arg], ...], int, int, tuple[int, ...]], ...]  # (meta, warps, stages, grid)
    mutates: tuple[str, ...]  # parameters it writes
    examples: tuple[tuple[str, Arg], ...] = ()  # per parameter: ("tensor", "float32@cuda:0") or ("value", 3)
    node: str = ""  # the graph node it came from
    importable: bool = True  # another process can import it by `kernel` (else the graph is not cached on disk)


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """A node with several kernels computing it: the first call times them and keeps the fastest."""

    local: str  # the name generated code calls the choice by
    candidates: tuple[str, ...]  # kernel_ops functions taking the same arguments
    node: str
    target: str  # the ATen overload


@dataclass(frozen=True, slots=True)
class FusedKernel:
    """A group of graph nodes the fusion pass runs as one generated Triton kernel (`opgen.runtime.passes.fusion`).

    The body calls it by `local` like a kernel_ops function: inputs in, fresh outputs out (and the
    inputs in `writes` written in place: a cache write may return nothing). It is bound at load time to
    a choice between the Triton kernel and `lines`, the ATen calls it replaces (the backend prints them
    as a function), timed on the first call.
    """

    local: str
    name: str  # the Triton function in `source`
    source: str  # the Triton module's text
    inputs: tuple[str, ...]  # the values it reads, in parameter order
    input_dtypes: tuple[str, ...]  # their dtypes (for the compile started at load time)
    outputs: tuple[Value, ...]  # the values it returns (allocated by the launcher's wrapper)
    configs: tuple[tuple[tuple[tuple[str, Arg], ...], int, int, tuple[int, ...]], ...]  # (meta, warps, stages, grid)
    nodes: tuple[str, ...]  # the graph nodes it covers
    describe: str  # "row kernel, 64 rows of 16 (1x4x16x16)"
    lines: tuple[KernelCall, ...] = ()  # the ATen sequence; () once printed (the source holds it)
    writes: tuple[Value, ...] = ()  # inputs it writes in place, with their metas (names among `inputs`)
    dependent_launch: bool = False  # its source waits for the kernel before it (passes.dependent_launch)

    @property
    def device(self) -> str:
        return (*self.outputs, *self.writes)[0].meta.device  # type: ignore[union-attr]

    @property
    def written_inputs(self) -> tuple[int, ...]:
        """Positions in `inputs` of the ones it writes."""
        written = {v.name for v in self.writes}
        return tuple(i for i, name in enumerate(self.inputs) if name in written)
