"""Independent pointwise kernels next to each other share one launch, and so do independent row kernels.

A decode step's rotary embedding is two pointwise kernels, one over the queries and one over the keys,
which read the same angles and nothing of each other, one after the other in every layer; OLMo-2 norms
its queries and its keys, two row kernels side by side. At batch 1 each has a few thousand elements:
the launch and the start of its memory traffic cost more than its work. Here a run of such kernels
(`FusedGroup`s of one kind, pointwise or row, at most `MAX_PARTS`) becomes one kernel whose programs
take the groups' blocks one group after another (`codegen.triton.horizontal`).

A run: fused kernels of one kind in body order where none reads what an earlier one of the run returns,
and the lines between write no memory and read nothing the run's kernels return (the merged kernel runs
where the last one did), except views: a view of what the run returns (gpt-fast reshapes each rotated
tensor right after its kernel), and views of those, move to just after the merged kernel, where no
kernel of the run reads them. One multi-kernel choice against every ATen call the kernels replaced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from opgen.runtime.ir import FusedGroup, FusedKernel, HorizontalPlan, Line, Program, defs, uses
from opgen.runtime.passes.analysis import fresh_namer, is_view_call, writes_memory
from opgen.runtime.passes.fusion.calls import absorbing, called
from opgen.runtime.registry import KernelRegistry

MAX_PARTS = 4
MAX_ROW_ELEMENTS = 1 << 16  # a row kernel larger than this keeps its launch (decode's q/k norms: a few thousand)


def fuse_horizontal(program: Program, registry: KernelRegistry) -> Program:
    specs = {spec.local: spec for spec in program.fused}
    found_runs = [run for run in _runs(program.body, specs, registry) if len(run.kernels) > 1]
    if not found_runs:
        return program
    program, runs = _views_after(program, found_runs)
    locals_ = fresh_namer(program, "fused")
    found, gone = [], set()
    for run in runs:
        parts = [specs[program.body[at].kernel] for at in run]  # type: ignore[union-attr]
        gone |= {p.local for p in parts}
        found.append((merged(parts, next(locals_)), run, run[-1]))
    return absorbing(program, found, gone)


def _part(line: Line, specs: dict[str, FusedKernel]) -> FusedKernel | None:
    """The fused kernel `line` calls where it may join a run: any pointwise one, a row one of a few rows."""
    spec = called(line, specs)
    if spec is None or not isinstance(spec.plan, FusedGroup) or spec.writes:
        return None
    if spec.plan.kind == "row" and math.prod(spec.plan.shape) > MAX_ROW_ELEMENTS:
        return None  # its own launch is no large part of its time, and its tiles are its own
    return spec


def _kind(spec: FusedKernel) -> str:
    return spec.plan.kind  # type: ignore[union-attr]


@dataclass
class _Run:
    kernels: list[int] = field(default_factory=list)  # body indices of the run's kernels
    views: list[int] = field(default_factory=list)  # views of their results between them, moved after the last
    returned: set[str] = field(default_factory=set)  # what the kernels return, and the views of it
    kind: str = ""  # its kernels': "pointwise" or "row"


def _runs(body: tuple[Line, ...], specs: dict[str, FusedKernel], registry: KernelRegistry) -> list[_Run]:
    """Each run (see the module's docstring), in body order."""
    runs: list[_Run] = []
    run = _Run()
    for at, line in enumerate(body):
        spec = _part(line, specs)
        reads_run = bool(set(uses(line)) & run.returned)
        joins = spec is not None and (not run.kernels or _kind(spec) == run.kind)
        if joins and not reads_run and len(run.kernels) < MAX_PARTS:
            run.kind = _kind(spec)  # type: ignore[arg-type]
            run.kernels.append(at)
            run.returned |= {v.name for v in spec.outputs}
            continue
        if run.kernels and reads_run and spec is None and is_view_call(line, registry):
            run.views.append(at)
            run.returned |= {v.name for v in defs(line)}
            continue
        if run.kernels and (writes_memory(line) or reads_run or spec is not None):
            runs.append(run)
            run = _Run([at], [], {v.name for v in spec.outputs}, _kind(spec)) if spec is not None else _Run()
    if run.kernels:
        runs.append(run)
    for run in runs:  # views after the last kernel stay where they are
        run.views = [at for at in run.views if at < run.kernels[-1]]
    return runs


def _views_after(program: Program, runs: list[_Run]) -> tuple[Program, list[list[int]]]:
    """The body with each run's views moved to just after its last kernel; the runs' kernels' new indices."""
    moved = {at for run in runs for at in run.views}
    if not moved:
        return program, [run.kernels for run in runs]
    after = {run.kernels[-1]: run.views for run in runs}
    body: list[Line] = []
    where: dict[int, int] = {}
    for at, line in enumerate(program.body):
        if at in moved:
            continue
        where[at] = len(body)
        body.append(line)
        body.extend(program.body[v] for v in after.get(at, ()))
    return replace(program, body=tuple(body)), [[where[at] for at in run.kernels] for run in runs]


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
        describe=f"one launch for {len(parts)} {_kind(parts[0])} kernels: " + "; ".join(p.describe for p in parts),
        lines=[line for p in parts for line in p.lines],
    )
