"""Every fused kernel of a program, printed: the step after the passes (`opgen.runtime.pipeline`).

The passes that make Triton kernels decide only: each leaves a `FusedKernel` holding its plan (what the
kernel computes, `opgen.runtime.ir.plans`) and a call of it in the body. Here each plan becomes its
kernel's source, name and configs, by the printer of its kind; the calls of the kernel are named after
it (`FusedKernel.target`), and a kernel marked to launch dependently waits for the one before it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import assert_never

from opgen.runtime.codegen.triton import (
    attention,
    attention_grouped,
    cache_writes,
    few_rows,
    gemv,
    gemv_prologue,
    groups,
    horizontal,
    spatial_mean,
)
from opgen.runtime.codegen.triton.dependent_launch import waiting
from opgen.runtime.codegen.triton.module import Kernel
from opgen.runtime.ir import (
    AttentionPlan,
    CacheWritePlan,
    FusedGroup,
    FusedKernel,
    GemvPlan,
    HorizontalPlan,
    KernelCall,
    KernelPlan,
    Line,
    Program,
    SpatialMeanPlan,
)


def print_kernels(program: Program) -> Program:
    """`program` with each planned kernel printed and its calls named after it (itself if none is)."""
    if not any(spec.plan is not None or spec.dependent_launch for spec in program.fused):
        return program
    fused = tuple(printed(spec) for spec in program.fused)
    targets = {new.local: new.target for old, new in zip(program.fused, fused, strict=True) if old.plan is not None}

    def named(lines: tuple[Line, ...]) -> tuple[Line, ...]:
        return tuple(
            replace(line, target=targets[line.kernel])
            if isinstance(line, KernelCall) and line.jit and line.kernel in targets
            else line
            for line in lines
        )

    return replace(program, fused=fused, setup=named(program.setup), memo=named(program.memo), body=named(program.body))


def printed(spec: FusedKernel) -> FusedKernel:
    """The kernel with its source (from its plan, if it has one; waiting at its top where it launches
    dependently)."""
    if spec.plan is not None:
        kernel = write(spec.plan)
        spec = spec.printed(kernel.name, kernel.source, kernel.configs)
    if spec.dependent_launch:
        spec = replace(spec, source=waiting(spec.source, spec.name))
    return spec


def write(plan: KernelPlan) -> Kernel:
    """The kernel a plan describes, by the printer of its kind."""
    match plan:
        case FusedGroup():
            return groups.kernel(plan)
        case GemvPlan(m=1, prologue=None):
            return Kernel(*gemv.kernel(plan), gemv.configs(plan))
        case GemvPlan(m=1):
            return Kernel(*gemv_prologue.kernel(plan), gemv_prologue.configs(plan))
        case GemvPlan():
            return Kernel(*few_rows.kernel(plan), few_rows.configs(plan))
        case AttentionPlan(grouped=True):
            return Kernel(*attention_grouped.kernel(plan), attention.configs(plan))
        case AttentionPlan():
            return Kernel(*attention.kernel(plan), attention.configs(plan))
        case CacheWritePlan():
            return Kernel(*cache_writes.kernel(plan), cache_writes.configs(plan))
        case SpatialMeanPlan():
            return Kernel(*spatial_mean.kernel(plan), spatial_mean.configs(plan))
        case HorizontalPlan():
            return horizontal.kernel(plan)
        case _:
            assert_never(plan)
