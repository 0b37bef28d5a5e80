"""`python -m opgen.bench graphs --device cuda`: the BENCH.md graph cases on the GPU.

Candidates: eager, torch.compile (Inductor default), torch.compile(mode="reduce-overhead") (CUDA
graphs), opgen.compile plain and with cuda_graphs=True, and plain on the C++ executor
(`opgen_cpp`: backend="cpp"; a graph it cannot run yet stays Python, and the run says so).
`--without-jit` leaves the passes that make Triton kernels out of every opgen candidate (the C++
executor runs no Triton kernels yet). One process, interleaved, no_grad, torch's
default numerics (cuDNN TF32 on). Two timings per candidate (../shared/BENCH.md): **sync**, N calls
then one torch.cuda.synchronize(), per call; and **enqueue**, the host time of one call with the
GPU idle at its start (each call is followed by a synchronize outside the timed region). Compile
time is the first call, synchronized, including capture for the graph modes; reduce-overhead
records its graph on a later call, so its compile time includes its first three calls.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from opgen.bench import models
from opgen.bench.timing import format_table, interleaved, max_error, target_line

CANDIDATES = ("eager", "inductor", "reduce_overhead", "opgen", "opgen_graphs", "opgen_cpp")
LABELS = {
    "eager": "eager",
    "inductor": "torch.compile (inductor)",
    "reduce_overhead": "torch.compile reduce-overhead",
    "opgen": 'opgen.compile backend="python"',
    "opgen_graphs": "opgen.compile cuda_graphs",
    "opgen_cpp": "opgen.compile backend=cpp",
}
FIRST_CALLS = {"reduce_overhead": 3}  # cudagraph trees warm up, then record on a later call


@dataclass(frozen=True, slots=True)
class Result:
    case: str
    candidate: str
    sync_us: float
    sync_min_us: float
    sync_max_us: float
    enqueue_us: float
    enqueue_min_us: float
    enqueue_max_us: float
    sync_ratio: float
    enqueue_ratio: float
    compile_s: float
    max_abs_err: float


def build_candidate(
    name: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], passes: Sequence[str] | None = None
) -> Callable[[], Any]:
    """One candidate of the GPU benchmarks (this one and gpu_models), ready to call on `inputs`; `passes` for
    opgen's (default: all)."""
    import opgen

    match name:
        case "eager":
            fn: Callable[..., Any] = model.forward
        case "inductor":
            fn = torch.compile(model)
        case "reduce_overhead":
            fn = torch.compile(model, mode="reduce-overhead")
        case "opgen":
            fn = opgen.compile(model, inputs, passes=passes, backend="python")
        case "opgen_default":  # backend="auto": the C++ executor where the program runs there
            fn = opgen.compile(model, inputs, passes=passes)
        case "opgen_graphs":
            fn = opgen.compile(model, inputs, cuda_graphs=True, passes=passes)
        case "opgen_cpp":
            fn = opgen.compile(model, inputs, backend="cpp", passes=passes)
            notes = fn.report().notes  # type: ignore[attr-defined]
            print(f"    {next((n for n in notes if n.startswith('backend:')), '')}", flush=True)
        case _:
            raise ValueError(f"unknown candidate {name}")
    return functools.partial(fn, *inputs)


def run_case(
    case: models.Case, candidates: Sequence[str], repeats: int, target_s: float, passes: Sequence[str] | None = None
) -> list[Result]:
    sync = torch.cuda.synchronize
    with torch.no_grad():
        model, inputs = case.model().cuda(), tuple(t.cuda() for t in case.inputs())
        reference = model(*inputs)
        calls, compile_s, errors = [], [], []
        # One reset per case, before any candidate: a reset also resets the CUDA-graph trees of a
        # reduce-overhead model built before it, which later replays through freed memory.
        torch._dynamo.reset()
        for name in candidates:
            build = functools.partial(build_candidate, name, model, inputs, passes)
            call, out, seconds = ready(build, FIRST_CALLS.get(name, 1))
            compile_s.append(seconds)
            errors.append(max_error(out, reference))
            calls.append(call)
            print(f"  {case.name}: {LABELS[name]} ready in {compile_s[-1]:.2f} s (max abs err {errors[-1]:.1e})",
                  flush=True)  # fmt: skip
        warmup = 3
        synced = interleaved(calls, repeats=repeats, warmup=warmup, target_s=target_s, sync=sync)
        enqueued = interleaved(calls, repeats=repeats, warmup=warmup, target_s=target_s, sync=sync, enqueue=True)
    return [
        Result(case.name, name, s.median_us, s.min_us, s.max_us, e.median_us, e.min_us, e.max_us,
               s.ratio_to(synced[0]), e.ratio_to(enqueued[0]), compile_s[i], errors[i])
        for i, (name, s, e) in enumerate(zip(candidates, synced, enqueued, strict=True))
    ]  # fmt: skip


def ready(build: Callable[[], Callable[[], Any]], first_calls: int) -> tuple[Callable[[], Any], Any, float]:
    """Build a candidate and make its first calls: (the call, its last output, seconds, synchronized)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    call = build()
    for _ in range(first_calls):
        out = call()
    torch.cuda.synchronize()
    return call, out, time.perf_counter() - start


def results_table(results: Sequence[Result]) -> str:
    headers = ["case", "candidate", "sync us", "(min-max)", "x eager", "enqueue us", "(min-max)", "x eager",
               "compile s", "max abs err"]  # fmt: skip
    rows = [
        [r.case, LABELS[r.candidate], r.sync_us, f"{r.sync_min_us:.1f}-{r.sync_max_us:.1f}", f"{r.sync_ratio:.3f}",
         r.enqueue_us, f"{r.enqueue_min_us:.1f}-{r.enqueue_max_us:.1f}", f"{r.enqueue_ratio:.3f}",
         f"{r.compile_s:.2f}", f"{r.max_abs_err:.1e}"]
        for r in results
    ]  # fmt: skip
    return format_table(headers, rows)


def target_lines(results: Sequence[Result]) -> list[str]:
    """The GPU issue's definition of done, as measured in this run."""
    by = {(r.case, r.candidate): r for r in results}
    lines = []

    def check(what: str, value: float, limit: float) -> None:
        lines.append(target_line(what, value, limit))

    for case in ("resnet18_b1", "resnet18_b10"):
        ours, theirs = by.get((case, "opgen_graphs")), by.get((case, "reduce_overhead"))
        if ours and theirs:
            check(f"{case} graph-mode sync / reduce-overhead sync", ours.sync_us / theirs.sync_us, 1.0)
            check(f"{case} graph-mode enqueue / reduce-overhead enqueue", ours.enqueue_us / theirs.enqueue_us, 0.5)
            check(f"{case} graph-mode first call / reduce-overhead compile", ours.compile_s / theirs.compile_s, 0.5)
    if (single := by.get(("single_add", "opgen_graphs"))) is not None:
        check("single_add graph-mode enqueue / eager enqueue", single.enqueue_ratio, 0.5)
    if (plain := by.get(("resnet18_b1", "opgen"))) is not None:
        check("resnet18_b1 plain sync / eager sync", plain.sync_ratio, 0.5)
    for case in ("gpt_block", "resnet18_b1"):
        cpp, python = by.get((case, "opgen_cpp")), by.get((case, "opgen"))
        if cpp and python:
            check(f"{case} plain enqueue, C++ backend / Python backend", cpp.enqueue_us / python.enqueue_us, 0.8)
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench graphs --device cuda", description=__doc__)
    parser.add_argument("--cases", nargs="+", choices=[c.name for c in models.cases()], help="default: all")
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per candidate and timing")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--without-jit", action="store_true", help="opgen's candidates without the Triton passes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    candidates = ["eager"] + [c for c in args.candidates if c != "eager"]
    passes = None
    if args.without_jit:
        from opgen.runtime.passes import JIT_PASSES
        from opgen.runtime.pipeline import default_pipeline

        passes = tuple(p for p in default_pipeline() if p not in JIT_PASSES)
    print(f"opgen graph benchmark: torch {torch.__version__}, {torch.cuda.get_device_name()}, no_grad, interleaved",
          flush=True)  # fmt: skip
    results: list[Result] = []
    for case in models.cases():
        if not args.cases or case.name in args.cases:
            results += run_case(case, candidates, args.repeats, 0.2 if case.heavy else 0.05, passes)
    print("\n" + results_table(results) + "\n\ntargets:\n" + "\n".join(target_lines(results)))
    if args.json:
        payload = {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(),
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"wrote {args.json}")
    return 0
