"""`python -m opgen.bench gpu_work`: how much GPU work a call does, for the fusion issue's cases.

Per candidate, one process, no_grad, torch's default numerics: **kernel us**, the GPU time of the
kernels of one call (the profiler's sum of kernel, memset and memcpy durations over `--calls`
calls, divided by the calls), **launches**, the GPU activities of one call (kernels, memsets and
copies; in CUDA-graph modes they run inside one graph launch), and **sync us**, N calls then one
`torch.cuda.synchronize()`, per call, interleaved (`../shared/BENCH.md`).

Candidates: eager, torch.compile default (Inductor) and reduce-overhead, opgen.compile without and
with the fusion pass, plain and with cuda_graphs=True.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opgen.bench import models
from opgen.bench.graphs_cuda import ready
from opgen.bench.timing import format_table, interleaved, max_error, target_line

CANDIDATES = ("eager", "inductor", "reduce_overhead", "opgen_unfused", "opgen", "opgen_graphs_unfused", "opgen_graphs")
LABELS = {
    "eager": "eager",
    "inductor": "torch.compile (inductor)",
    "reduce_overhead": "torch.compile reduce-overhead",
    "opgen_unfused": "opgen.compile, no fusion",
    "opgen": "opgen.compile",
    "opgen_graphs_unfused": "opgen cuda_graphs, no fusion",
    "opgen_graphs": "opgen cuda_graphs",
}
FIRST_CALLS = {"reduce_overhead": 3}
CASES = ("gpt_block", "resnet18_b10")


@dataclass(frozen=True, slots=True)
class Result:
    case: str
    candidate: str
    kernel_us: float
    launches: float
    sync_us: float
    compile_s: float
    max_abs_err: float


def _build(name: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    import opgen
    from opgen.runtime.pipeline import default_pipeline

    unfused = tuple(p for p in default_pipeline() if p != "fusion")
    match name:
        case "eager":
            fn: Callable[..., Any] = model.forward
        case "inductor":
            fn = torch.compile(model)
        case "reduce_overhead":
            fn = torch.compile(model, mode="reduce-overhead")
        case "opgen_unfused":
            fn = opgen.compile(model, inputs, passes=unfused)
        case "opgen":
            fn = opgen.compile(model, inputs)
        case "opgen_graphs_unfused":
            fn = opgen.compile(model, inputs, cuda_graphs=True, passes=unfused)
        case "opgen_graphs":
            fn = opgen.compile(model, inputs, cuda_graphs=True)
        case _:
            raise ValueError(f"unknown candidate {name}")
    return functools.partial(fn, *inputs)


def kernel_table(call: Callable[[], Any], calls: int) -> dict[str, tuple[float, float]]:
    """GPU activity name -> (us, launches) per call: the profiler's kernels, memsets and copies."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    torch.cuda.synchronize()
    return activity_table(call, calls, ProfilerActivity.CUDA,
                          lambda event: event.name if event.device_type == DeviceType.CUDA else None)  # fmt: skip


def activity_table(call: Callable[[], Any], calls: int, activity: Any,
                   key: Callable[[Any], str | None]) -> dict[str, tuple[float, float]]:  # fmt: skip
    """`key(event)` -> (us, events) per call, over the profiler's events of `activity` in `calls` calls
    (events whose key is None left out); on CUDA, synchronized before the profile ends."""
    from torch.profiler import profile

    with profile(activities=[activity]) as prof:
        for _ in range(calls):
            call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    table: dict[str, tuple[float, float]] = {}
    for event in prof.events():
        name = key(event)
        if name is not None:
            us, launches = table.get(name, (0.0, 0.0))
            table[name] = (us + event.time_range.elapsed_us() / calls, launches + 1 / calls)
    return table


def totals(table: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(GPU us, activities) per call of a `kernel_table`."""
    return sum(us for us, _ in table.values()), sum(n for _, n in table.values())


def gpu_work(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(GPU us, activities) per call: the profiler's kernels, memsets and copies."""
    return totals(kernel_table(call, calls))


def run_case(case: models.Case, candidates: Sequence[str], calls: int, repeats: int) -> list[Result]:
    sync = torch.cuda.synchronize
    results = []
    with torch.no_grad():
        model, inputs = case.model().cuda(), tuple(t.cuda() for t in case.inputs())
        reference = model(*inputs)
        built, compile_s, errors, work = [], [], [], []
        # One reset per case, before any candidate: a reset also resets the CUDA-graph trees of a
        # reduce-overhead model built before it, which later replays through freed memory.
        torch._dynamo.reset()
        for name in candidates:
            call, out, seconds = ready(lambda name=name: _build(name, model, inputs), FIRST_CALLS.get(name, 1))  # type: ignore[misc]
            compile_s.append(seconds)
            errors.append(max_error(out, reference))
            for _ in range(3):
                call()
            work.append(gpu_work(call, calls))
            built.append(call)
            print(f"  {case.name}: {LABELS[name]}: ready in {compile_s[-1]:.2f} s, {work[-1][0]:.1f} us of GPU work "
                  f"in {work[-1][1]:.1f} launches per call (max abs err {errors[-1]:.1e})", flush=True)  # fmt: skip
            report = getattr(call.func, "report", None)
            for line in str(report()).splitlines() if report is not None and name.startswith("opgen") else ():
                if line.strip().startswith("fused "):
                    print(f"    {line.strip()}", flush=True)
        synced = interleaved(built, repeats=repeats, warmup=3, target_s=0.1, sync=sync)
        for i, name in enumerate(candidates):
            kernel_us, launches = work[i]
            results.append(Result(case.name, name, kernel_us, launches, synced[i].median_us, compile_s[i], errors[i]))
    return results


def results_table(results: Sequence[Result]) -> str:
    headers = ["case", "candidate", "GPU kernel us", "launches", "sync us", "compile s", "max abs err"]
    rows = [
        [r.case, LABELS[r.candidate], f"{r.kernel_us:.1f}", f"{r.launches:.1f}", f"{r.sync_us:.1f}",
         f"{r.compile_s:.2f}", f"{r.max_abs_err:.1e}"]
        for r in results
    ]  # fmt: skip
    return format_table(headers, rows)


def target_lines(results: Sequence[Result]) -> list[str]:
    """The fusion issue's definition of done, as measured in this run."""
    by = {(r.case, r.candidate): r for r in results}
    lines = []

    def check(what: str, value: float, limit: float) -> None:
        lines.append(target_line(what, value, limit))

    for case in CASES:
        ours, inductor = by.get((case, "opgen")), by.get((case, "inductor"))
        graphs, reduce_overhead = by.get((case, "opgen_graphs")), by.get((case, "reduce_overhead"))
        if ours and inductor:
            check(f"{case} GPU kernel time / inductor's", ours.kernel_us / inductor.kernel_us, 1.0)
            check(f"{case} plain sync / inductor's", ours.sync_us / inductor.sync_us, 0.9)
        if graphs and reduce_overhead:
            check(f"{case} graph-mode sync / reduce-overhead's", graphs.sync_us / reduce_overhead.sync_us, 1.0)
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench gpu_work", description=__doc__)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="default: all")
    parser.add_argument(
        "--candidates", nargs="+", choices=CANDIDATES, default=list(CANDIDATES), help="default: all (eager always runs)"
    )
    parser.add_argument("--calls", type=int, default=20, help="calls profiled per candidate")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per candidate")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("gpu_work needs a CUDA GPU")
    candidates = ["eager"] + [c for c in args.candidates if c != "eager"]
    print(f"opgen GPU work: torch {torch.__version__}, {torch.cuda.get_device_name()}, no_grad", flush=True)
    results: list[Result] = []
    for case in models.cases():
        if case.name in args.cases:
            results += run_case(case, candidates, args.calls, args.repeats)
    print("\n" + results_table(results) + "\n\ntargets:\n" + "\n".join(target_lines(results)))
    return 0
