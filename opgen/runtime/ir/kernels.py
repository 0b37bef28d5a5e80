"""The IR's records of kernels a program launches beyond kernel_ops: user Triton kernels, kernel
choices and fused kernels. Plain data, like the rest of `opgen.runtime.ir` (which re-exports them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from opgen.runtime.ir.lines import Arg, KernelCall, Value
from opgen.runtime.ir.plans import KernelPlan

Config = tuple[tuple[tuple[str, Arg], ...], int, int, tuple[int, ...]]  # a Triton kernel's (meta, warps, stages, grid)


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
    """Graph nodes a pass runs as one generated Triton kernel (`opgen.runtime.passes.fusion`).

    The body calls it by `local` like a kernel_ops function: inputs in, fresh outputs out (and the
    inputs in `writes` written in place: a cache write may return nothing). It is bound at load time to
    a choice between the Triton kernel and `lines`, the ATen calls it replaces (the backend prints them
    as a function), timed on the first call.

    A pass decides it: its `plan`, what the kernel computes (`opgen.runtime.ir.plans`). Once the passes
    have run, `opgen.runtime.codegen.triton` prints the plan into `source` (`printed`); `make` builds
    one, a pass's or one read back from disk.
    """

    local: str
    name: str  # the Triton function in `source` ("" until printed)
    source: str  # the Triton module's text ("" until printed)
    inputs: tuple[str, ...]  # the values it reads, in parameter order
    input_dtypes: tuple[str, ...]  # their dtypes (for the compile started at load time)
    outputs: tuple[Value, ...]  # the values it returns (allocated by the launcher's wrapper)
    configs: tuple[Config, ...]  # the candidates its first call tunes over
    nodes: tuple[str, ...]  # the graph nodes it covers, each once
    describe: str  # "row kernel, 64 rows of 16 (1x4x16x16)"
    lines: tuple[KernelCall, ...] = ()  # the ATen sequence; () once printed (the source holds it)
    writes: tuple[Value, ...] = ()  # inputs it writes in place, with their metas (names among `inputs`)
    dependent_launch: bool = False  # launched dependently: its source waits for the kernel before it
    plan: KernelPlan | None = None  # what its source computes, until printed (`codegen.triton`)

    @classmethod
    def make(
        cls,
        local: str,
        plan: KernelPlan | None,
        *,
        inputs: Iterable[tuple[str, str]],
        outputs: Iterable[Value],
        nodes: Iterable[str],
        describe: str,
        lines: Iterable[KernelCall] = (),
        writes: Iterable[Value] = (),
        dependent_launch: bool = False,
    ) -> FusedKernel:
        """The one way to build a fused kernel: a pass's, with the `plan` its source is printed from, or
        (`plan` None, then `printed`) one read back from disk. `inputs`: (value, dtype) in parameter order."""
        read = tuple(inputs)
        return cls(
            local=local, name="", source="", inputs=tuple(n for n, _ in read), input_dtypes=tuple(d for _, d in read),
            outputs=tuple(outputs), configs=(), nodes=tuple(dict.fromkeys(nodes)), describe=describe,
            lines=tuple(lines), writes=tuple(writes), dependent_launch=dependent_launch, plan=plan,
        )  # fmt: skip

    def printed(self, name: str, source: str, configs: tuple[Config, ...]) -> FusedKernel:
        """The kernel with its Triton function `name`, the module's `source` and the configs tuned over."""
        return replace(self, name=name, source=source, configs=configs, plan=None)

    @property
    def heading(self) -> str:
        """`fused0 (fused_1a2b3c4d5e6f): row kernel, 64 rows of 16 (...), nodes mul, _softmax`: how the report
        names it, the Triton function in parentheses (as a profiler names its launches)."""
        return f"{self.local} ({self.name}): {self.describe}, nodes {', '.join(self.nodes)}"

    @property
    def target(self) -> str:
        """What the body's call of it says it runs (the generated code's comment, the profiler's range)."""
        return f"fused Triton kernel {self.name}"

    @property
    def device(self) -> str:
        return (*self.outputs, *self.writes)[0].meta.device  # type: ignore[union-attr]

    @property
    def written_inputs(self) -> tuple[int, ...]:
        """Positions in `inputs` of the ones it writes."""
        written = {v.name for v in self.writes}
        return tuple(i for i, name in enumerate(self.inputs) if name in written)
