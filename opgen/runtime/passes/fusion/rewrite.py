"""GPU fusion: groups of pointwise nodes (and the row reductions that end or join them) become one
generated Triton kernel each.

`opgen.runtime.passes.fusion.groups` decides the groups, `opgen.runtime.passes.fusion.placement` carries
their outputs through the copies that move them, `opgen.runtime.passes.fusion.expressible` checks that
the Triton printer can write each (`opgen.runtime.codegen.triton.groups` writes it once the passes have
run). Here each group's calls leave the body and one call of a `FusedKernel` takes the place of
the last: it reads the group's inputs and returns the values anything after it reads; values only
the group reads are never written to memory. At load time the call is bound to a choice between
the Triton kernel and the ATen calls it replaced, timed on the first call (`opgen.runtime.execution.fused`), so
fusion never makes a graph slower than its ATen kernels, and a kernel that fails to compile leaves
the ATen calls running, with a warning.

CUDA values with static sizes only: CPU programs pass through unchanged. Optional, like every pass;
the default pipeline has it where opgen's JIT can run (`opgen.runtime.pipeline.default_pipeline`).
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Comment, FusedGroup, FusedKernel, KernelCall, Line, Program, Value
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.passes.fusion.expressible import unwritable
from opgen.runtime.passes.fusion.groups import find_groups
from opgen.runtime.passes.fusion.placement import place_outputs
from opgen.runtime.registry import KernelRegistry


def fuse(program: Program, registry: KernelRegistry) -> Program:
    found = place_outputs(find_groups(program, registry, singles=True), program, registry)
    if not found:
        return program
    locals_ = fresh_namer(program, "fused")
    placed: list[tuple[FusedKernel, tuple[int, ...], int]] = []
    unfused: list[tuple[KernelCall, str]] = []  # a group the backend cannot write: its first line, and why
    for item in found:
        local, group = next(locals_), item.group
        problem = unwritable(group)
        if problem is not None:
            unfused.append((item.lines[0], f"not fused ({', '.join(group.nodes)}): {problem}"))
            continue
        placed.append((group_kernel(local, group, item.lines), item.members, item.members[-1]))
    return _noted(place(program, placed), unfused)


def group_kernel(local: str, group: FusedGroup, lines: tuple[KernelCall, ...]) -> FusedKernel:
    """The kernel of a group found in the body (its calls `lines`), named `local`."""
    return FusedKernel.make(
        local,
        group,
        inputs=((t.name, t.meta.dtype) for t in group.inputs),
        outputs=(Value(t.name, t.meta) for t in group.outputs),
        nodes=group.nodes,
        describe=group.describe(),
        lines=lines,
    )


def _noted(program: Program, unfused: list[tuple[KernelCall, str]]) -> Program:
    """A comment in the generated code above each group that stays ATen calls, saying why (a kernel the
    backend could not write is otherwise invisible)."""
    if not unfused:
        return program
    notes = {id(line): text for line, text in unfused}
    body: list[Line] = []
    for line in program.body:
        if id(line) in notes:
            body.append(Comment(notes[id(line)]))
        body.append(line)
    return replace(program, body=tuple(body))
