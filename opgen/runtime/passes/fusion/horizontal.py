"""Independent pointwise kernels next to each other share one launch.

A decode step's rotary embedding is two pointwise kernels, one over the queries and one over the keys,
which read the same angles and nothing of each other, one after the other in every layer. At batch 1
each has a few thousand elements: the launch and the start of its memory traffic cost more than its
work. Here a run of such kernels (pointwise `FusedGroup`s, at most `MAX_PARTS`) becomes one kernel whose
programs take the groups' blocks one group after another (`codegen.triton.horizontal`).

A run: fused pointwise kernels in body order where none reads what an earlier one of the run returns,
and the lines between write no memory and read nothing the run's kernels return (the merged kernel runs
where the last one did). One multi-kernel choice against every ATen call the kernels replaced.
"""

from __future__ import annotations

from opgen.runtime.ir import FusedGroup, FusedKernel, HorizontalPlan, Line, Program, uses
from opgen.runtime.passes.analysis import fresh_namer, writes_memory
from opgen.runtime.passes.fusion.calls import absorbing, called
from opgen.runtime.registry import KernelRegistry

MAX_PARTS = 4


def fuse_horizontal(program: Program, registry: KernelRegistry) -> Program:
    specs = {spec.local: spec for spec in program.fused}
    runs = [run for run in _runs(program.body, specs) if len(run) > 1]
    if not runs:
        return program
    locals_ = fresh_namer(program, "fused")
    found, gone = [], set()
    for run in runs:
        parts = [specs[program.body[at].kernel] for at in run]  # type: ignore[union-attr]
        gone |= {p.local for p in parts}
        found.append((merged(parts, next(locals_)), run, run[-1]))
    return absorbing(program, found, gone)


def _pointwise(line: Line, specs: dict[str, FusedKernel]) -> FusedKernel | None:
    spec = called(line, specs)
    if spec is None or not isinstance(spec.plan, FusedGroup) or spec.plan.kind != "pointwise" or spec.writes:
        return None
    return spec


def _runs(body: tuple[Line, ...], specs: dict[str, FusedKernel]) -> list[list[int]]:
    """Body indices of each run (see the module's docstring), in body order."""
    runs: list[list[int]] = []
    run: list[int] = []
    returned: set[str] = set()  # what the open run's kernels return
    for at, line in enumerate(body):
        spec = _pointwise(line, specs)
        if spec is not None and not (set(uses(line)) & returned) and len(run) < MAX_PARTS:
            run.append(at)
            returned |= {v.name for v in spec.outputs}
            continue
        if run and (writes_memory(line) or set(uses(line)) & returned or spec is not None):
            runs.append(run)
            run, returned = ([at], {v.name for v in spec.outputs}) if spec is not None else ([], set())
    if run:
        runs.append(run)
    return runs


def merged(parts: list[FusedKernel], local: str) -> FusedKernel:
    """One kernel for `parts`: their inputs, each once; their outputs; their ATen calls, in order."""
    plan = HorizontalPlan(tuple(p.plan for p in parts))  # type: ignore[misc]
    inputs = dict.fromkeys((n, d) for p in parts for n, d in zip(p.inputs, p.input_dtypes, strict=True))
    return FusedKernel.make(
        local,
        plan,
        inputs=inputs,
        outputs=[v for p in parts for v in p.outputs],
        nodes=[n for p in parts for n in p.nodes],
        describe=f"one launch for {len(parts)} pointwise kernels: " + "; ".join(p.describe for p in parts),
        lines=[line for p in parts for line in p.lines],
    )
