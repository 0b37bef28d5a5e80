"""The Triton source of one launch for several independent pointwise groups, or row groups (a
`HorizontalPlan` of `opgen.runtime.passes.fusion.horizontal`).

Each group is its own kernel's code as a function of its block number (`group_parts.pointwise_part`,
`group_parts.row_part`); programs are laid out group after group (the first group's blocks, then the
second's, ...), all with one BLOCK (pointwise), or one BLOCK_R of rows and a BLOCK_N that covers the
longest row (rows). The kernel's parameters are the groups' inputs, each once (two groups reading one tensor
share its parameter), then their outputs; names of graph values never appear, so a model's layers
share one kernel.
"""

from __future__ import annotations

import math

from opgen.runtime.codegen.triton.group_parts import pointwise_part, row_part
from opgen.runtime.codegen.triton.groups import row_configs
from opgen.runtime.codegen.triton.module import Kernel, jit_module, next_power_of_2
from opgen.runtime.ir import Config, HorizontalPlan

BLOCKS = ((256, 2), (1024, 4))  # (elements per program, warps): the first call's timing picks


def inputs(plan: HorizontalPlan) -> list[str]:
    """The graph values the kernel reads, each once, in the order the groups first read them."""
    return list(dict.fromkeys(t.name for g in plan.parts for t in g.inputs))


def kernel(plan: HorizontalPlan) -> Kernel:
    reads = inputs(plan)
    outputs = [t.name for g in plan.parts for t in g.outputs]
    params = [*(f"in{i}" for i in range(len(reads))), *(f"out{i}" for i in range(len(outputs)))]
    rows = plan.parts[0].kind == "row"
    meta = ("BLOCK_R", "BLOCK_N") if rows else ("BLOCK",)
    helpers, calls, start = [], [], ""
    for i, group in enumerate(plan.parts):
        helpers.append((row_part if rows else pointwise_part)(group, f"_part{i}"))
        args = [f"in{reads.index(t.name)}" for t in group.inputs]
        args += [f"out{outputs.index(t.name)}" for t in group.outputs]
        size, per = (math.prod(group.shape[:-1]), "BLOCK_R") if rows else (math.prod(group.shape), "BLOCK")
        blocks = f"({size} + {per} - 1) // {per}"
        end = f"{start} + {blocks}" if start else blocks
        block = f"pid - ({start})" if start else "pid"
        calls.append((end, f"_part{i}({', '.join([*args, block, *meta])})"))
        start = end
    body = [f"    # one launch, {len(plan.parts)} groups: " + "; ".join(g.describe() for g in plan.parts)]
    body.append("    pid = tl.program_id(0)")
    for i, (end, call) in enumerate(calls):
        test = "else:" if i == len(calls) - 1 else f"{'if' if i == 0 else 'elif'} pid < {end}:"
        body += [f"    {test}", f"        {call}"]
    constexprs = ", ".join(f"{m}: tl.constexpr" for m in meta)
    name, source = jit_module("fused", params, constexprs, "\n".join(body), "\n\n".join(helpers))
    return Kernel(name, source, configs(plan))


def configs(plan: HorizontalPlan) -> tuple[Config, ...]:
    if plan.parts[0].kind == "row":
        return tuple(row_configs(plan.parts))
    largest = max(math.prod(g.shape) for g in plan.parts)
    found: list[Config] = []
    for block, warps in BLOCKS:
        block = min(block, max(128, next_power_of_2(largest)))
        grid = (sum(-(-math.prod(g.shape) // block) for g in plan.parts),)
        config: Config = ((("BLOCK", block),), warps, 1, grid)
        if config not in found:
            found.append(config)
    return tuple(found)
