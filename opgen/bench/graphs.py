"""`python -m opgen.bench graphs`: the BENCH.md graph cases through eager, Inductor, AOTInductor and opgen.

One process, every call under torch.no_grad(); the cases run at 1 thread and then at all cores
(`--threads`, default `1,all`), each setting compiling its own candidates. Candidates
are timed interleaved (../shared/BENCH.md), each called through `functools.partial(fn, *inputs)`;
the table reports the median per call with min/max over the repeats and the ratio to eager measured
in the same run. Compile times (first call,
including codegen and any C++ compilation) are reported separately; for opgen.compile the part
after torch.export is given too. Eager is `model.forward(*inputs)` (the module's own code, without
the top-level `nn.Module.__call__` hooks, so single_add is the `x + y` of BENCH.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from opgen.bench import cpp_loop, models
from opgen.bench.plots import ratio_bars
from opgen.bench.timing import Timing, format_table, interleaved, max_error

CANDIDATES = ("eager", "inductor", "aoti", "opgen", "opgen_cpp", "opgen_package", "opgen_backend", "cpp_loop")
LABELS = {
    "eager": "eager",
    "inductor": "torch.compile (inductor)",
    "aoti": "AOTInductor",
    "opgen": 'opgen.compile(backend="python")',
    "opgen_cpp": 'opgen.compile(backend="cpp")',
    "opgen_package": "opgen.package + load_package",
    "opgen_backend": 'torch.compile(backend="opgen")',
    "cpp_loop": "C++ loop over the kernel calls",
}
# Targets for opgen.compile, as ratios to eager (the definition of done).
TARGETS = {"single_add": 0.8, "reshape_add": 0.35, "resnet18_b1": 0.95, "resnet18_b10": 0.98, "gpt_block": 0.7}
SPEEDUP_OVER_COMPILERS = {"single_add": 10.0, "reshape_add": 10.0}
CPP_OVER_LOOP = 1.1  # the C++ backend's time per call, at most this times the hand-written C++ loop's
RESNET_CODEGEN_BUDGET_S = 2.0


@dataclass(frozen=True, slots=True)
class Result:
    case: str
    candidate: str
    median_us: float
    min_us: float
    max_us: float
    ratio: float
    compile_s: float
    codegen_s: float | None  # opgen.compile: compile time without torch.export (lowering to first result)
    max_abs_err: float
    threads: int = 1


def _compile_inductor(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    return functools.partial(torch.compile(model), *inputs)


def _compile_aoti(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    ep = torch.export.export(model, inputs)
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=os.path.join(tempfile.mkdtemp(prefix="opgen-bench-aoti-"), "model.pt2")
    )
    return _loaded("AOTInductor", lambda: torch._inductor.aoti_load_package(path), inputs)


def _compile_opgen_package(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    import opgen

    path = opgen.package(model, inputs, os.path.join(tempfile.mkdtemp(prefix="opgen-bench-package-"), "model.opgen"))
    return _loaded("opgen package", lambda: opgen.load_package(path), inputs)


def _loaded(label: str, load: Callable[[], Any], inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """Load a package and make its first call, printing how long that took (a deployment's start-up)."""
    start = time.perf_counter()
    fn = load()
    fn(*inputs)
    print(f"    {label}: load + first call {time.perf_counter() - start:.3f} s", flush=True)
    return functools.partial(fn, *inputs)


def _compile_opgen(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    import opgen

    return functools.partial(opgen.compile(model, inputs, backend="python"), *inputs)


def _compile_opgen_cpp(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    import opgen

    return functools.partial(opgen.compile(model, inputs, backend="cpp"), *inputs)


def _compile_opgen_backend(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    return functools.partial(torch.compile(model, backend="opgen"), *inputs)


def _eager(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    return functools.partial(model.forward, *inputs)


BUILDERS = {
    "eager": _eager,
    "inductor": _compile_inductor,
    "aoti": _compile_aoti,
    "opgen": _compile_opgen,
    "opgen_cpp": _compile_opgen_cpp,
    "opgen_package": _compile_opgen_package,
    "opgen_backend": _compile_opgen_backend,
}


# Other compilers, measured for comparison: one that fails on a case is left out of it with a line
# saying why (AOTInductor cannot compile a graph that writes a lifted tensor, as the decode step does).
# opgen's own candidates are never left out: their failure is a bug and stops the run.
OTHERS = ("inductor", "aoti")


def build(
    case: models.Case, candidates: list[str]
) -> tuple[list[Callable[[], Any]], list[float], list[float | None], list[float]]:
    """Each candidate's first call; a comparison candidate that fails is removed from `candidates`."""
    model, inputs = case.model(), case.inputs()
    reference = model(*inputs)
    calls, compile_s, codegen_s, errors = [], [], [], []
    for name in list(candidates):
        torch._dynamo.reset()
        start = time.perf_counter()
        try:
            call = cpp_loop.build(case.name, inputs) if name == "cpp_loop" else BUILDERS[name](model, inputs)
            out = call()  # the first call: Dynamo tracing and lazy compilation happen here
        except Exception as exc:
            if name not in OTHERS:
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:160]
            print(f"  {case.name}: {LABELS[name]} left out: it failed ({type(exc).__name__}: {first})", flush=True)
            candidates.remove(name)
            continue
        compile_s.append(time.perf_counter() - start)
        report = getattr(getattr(call, "func", None), "report", None)  # opgen.compile's result reports export time
        opgen_compile = name in ("opgen", "opgen_cpp")
        codegen_s.append(compile_s[-1] - report().export_seconds if opgen_compile and report else None)
        errors.append(max_error(out, reference))
        calls.append(call)
        print(
            f"  {case.name}: {LABELS[name]} ready in {compile_s[-1]:.2f} s (max abs err {errors[-1]:.2e})", flush=True
        )
    return calls, compile_s, codegen_s, errors


def run_case(
    case: models.Case, candidates: Sequence[str], repeats: int, target_s: float, threads: int = 1
) -> list[Result]:
    candidates = [c for c in candidates if c != "cpp_loop" or cpp_loop.applies(case.name)]
    if "cpp_loop" in candidates and (why := cpp_loop.missing()) is not None:
        print(f"  {case.name}: {LABELS['cpp_loop']} skipped: it could not be built ({why})", flush=True)
        candidates.remove("cpp_loop")
    with torch.no_grad():
        calls, compile_s, codegen_s, errors = build(case, candidates)
        warmup = 1 if case.heavy else 3
        timings: list[Timing] = interleaved(calls, repeats=repeats, warmup=warmup, target_s=target_s)
    if "cpp_loop" in candidates:  # one of its calls is LOOP iterations
        at = candidates.index("cpp_loop")
        t = timings[at]
        timings[at] = Timing(t.median_us / cpp_loop.LOOP, t.min_us / cpp_loop.LOOP, t.max_us / cpp_loop.LOOP)
    base = timings[0]
    return [
        Result(
            case.name,
            name,
            t.median_us,
            t.min_us,
            t.max_us,
            t.ratio_to(base),
            compile_s[i],
            codegen_s[i],
            errors[i],
            threads,
        )
        for i, (name, t) in enumerate(zip(candidates, timings, strict=True))
    ]


def results_table(results: Sequence[Result]) -> str:
    headers = [
        "case",
        "threads",
        "candidate",
        "median us",
        "min us",
        "max us",
        "x eager",
        "compile s",
        "codegen s",
        "max abs err",
    ]
    rows = [
        [r.case, r.threads, LABELS[r.candidate], r.median_us, r.min_us, r.max_us, f"{r.ratio:.3f}",
         f"{r.compile_s:.2f}", "" if r.codegen_s is None else f"{r.codegen_s:.3f}", f"{r.max_abs_err:.1e}"]
        for r in results
    ]  # fmt: skip
    return format_table(headers, rows)


def summary_table(results: Sequence[Result], candidates: Sequence[str]) -> str:
    keys = list(dict.fromkeys((r.case, r.threads) for r in results))
    by = {(r.case, r.threads, r.candidate): r for r in results}
    rows = [
        [case, threads] + [f"{by[case, threads, c].ratio:.3f}" if (case, threads, c) in by else "-" for c in candidates]
        for case, threads in keys
    ]
    return format_table(["ratio to eager (median)", "threads"] + [LABELS[c] for c in candidates], rows)


def compiler_lines(results: Sequence[Result]) -> list[str]:
    """opgen.compile against the faster of Inductor and AOTInductor, per case and thread count."""
    by = {(r.case, r.threads, r.candidate): r for r in results}
    lines = []
    for case, threads in dict.fromkeys((r.case, r.threads) for r in results):
        others = [by[case, threads, c] for c in ("inductor", "aoti") if (case, threads, c) in by]
        if (case, threads, "opgen") not in by or not others:
            continue
        best = min(others, key=lambda r: r.median_us)
        ratio = by[case, threads, "opgen"].median_us / best.median_us
        verdict = "met" if ratio <= 1.0 else "NOT met"
        what = f"opgen.compile {ratio:.3f}x the faster compiler ({LABELS[best.candidate]})"
        lines.append(f"  {case}, {threads} thread(s): {what} (target <= 1): {verdict}")
    return lines


def target_lines(results: Sequence[Result]) -> list[str]:
    """The ratio targets, at 1 thread (the overhead cases' setting), and opgen against the compilers."""
    by = {(r.case, r.candidate): r for r in results if r.threads == 1}
    lines = []
    for case, target in TARGETS.items():
        if (case, "opgen") in by:
            ratio = by[case, "opgen"].ratio
            verdict = "met" if ratio <= target else "NOT met"
            lines.append(f"  {case}: opgen.compile {ratio:.3f}x eager (target <= {target}): {verdict}")
    for case, factor in SPEEDUP_OVER_COMPILERS.items():
        for other in ("inductor", "aoti"):
            if (case, "opgen") in by and (case, other) in by:
                speedup = by[case, other].median_us / by[case, "opgen"].median_us
                verdict = "met" if speedup >= factor else "NOT met"
                what = f"opgen.compile {speedup:.1f}x faster than {LABELS[other]}"
                lines.append(f"  {case}: {what} (target >= {factor:g}x): {verdict}")
    for case in cpp_loop.CASES:
        if (case, "opgen_cpp") in by and (case, "cpp_loop") in by:
            ratio = by[case, "opgen_cpp"].median_us / by[case, "cpp_loop"].median_us
            verdict = "met" if ratio <= CPP_OVER_LOOP else "NOT met"
            what = f"{LABELS['opgen_cpp']} {ratio:.3f}x the hand-written C++ loop"
            lines.append(f"  {case}: {what} (target <= {CPP_OVER_LOOP}): {verdict}")
    codegen = by.get(("resnet18_b1", "opgen"))
    if codegen is not None and codegen.codegen_s is not None:
        verdict = "met" if codegen.codegen_s < RESNET_CODEGEN_BUDGET_S else "NOT met"
        lines.append(f"  resnet18 compile time without export: {codegen.codegen_s:.3f} s (target < 2 s): {verdict}")
    return lines + compiler_lines(results)


def save_png(results: Sequence[Result], candidates: Sequence[str], path: Path) -> str:
    by = {(f"{r.case} ({r.threads}t)", r.candidate): r.ratio for r in results}
    cases = list(dict.fromkeys(case for case, _ in by))
    title = "opgen graph benchmark, CPU (threads per case in parentheses)"
    ylabel = "time per call / eager (log scale; lower is faster)"
    return ratio_bars(by, cases, candidates, LABELS, path, ylabel=ylabel, title=title)


def thread_counts(text: str) -> tuple[int, ...]:
    """`1,all` -> (1, cores); duplicates dropped, order kept."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = []
    for item in text.split(","):
        item = item.strip()
        if item == "all":
            counts.append(cores)
        elif item.isdigit() and int(item) > 0:
            counts.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"thread counts are positive integers or 'all', not {item!r}")
    return tuple(dict.fromkeys(counts))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench graphs", description=__doc__.split("\n\n")[0])
    names = [c.name for c in models.cases()]
    parser.add_argument(
        "--cases", nargs="+", choices=names, help="cases to run (default: all; --quick: the light ones)"
    )
    parser.add_argument(
        "--candidates",
        nargs="+",
        choices=CANDIDATES,
        default=list(CANDIDATES),
        help="what to compare (eager always runs)",
    )
    parser.add_argument("--quick", action="store_true", help="skip the ResNet cases and use fewer, shorter repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per candidate (default 15, ResNet 5)")
    parser.add_argument(
        "--threads",
        type=thread_counts,
        default="1,all",
        help="comma-separated thread counts to run every case at; 'all' is every core this process may use "
        "(default: 1,all)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--png", type=Path, help="also write a bar chart of the ratios (needs matplotlib)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu (default): this benchmark; cuda: the GPU one (graphs_cuda.py: sync and enqueue times, "
        "CUDA-graph mode), which takes --cases, --candidates, --repeats and --json (see --device cuda --help)",
    )
    return parser


def _device(argv: list[str]) -> tuple[str, list[str]]:
    """`--device` and the other arguments: `--device cuda` is its own benchmark, with its own options."""
    pre = argparse.ArgumentParser(prog="python -m opgen.bench graphs", add_help=False)
    pre.add_argument("--device", default="cpu")  # a bad value: the whole parser below names the choices
    known, rest = pre.parse_known_args(argv)
    return known.device, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    device, rest = _device(argv)
    if device == "cuda":  # graphs_cuda.py; `--device cpu` is this one
        from opgen.bench import graphs_cuda

        return graphs_cuda.main(rest)
    args = _parser().parse_args(argv)
    selected = [
        c
        for c in models.cases()
        if (args.cases and c.name in args.cases) or (not args.cases and not (args.quick and c.heavy))
    ]
    candidates = ["eager"] + [c for c in args.candidates if c != "eager"]
    light_repeats = args.repeats or (9 if args.quick else 15)  # tiny graphs: many cheap repeats tame the noise
    heavy_repeats = args.repeats or 5
    results: list[Result] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(
            f"opgen graph benchmark: torch {torch.__version__}, CPU, {torch.get_num_threads()} thread(s), no_grad, "
            "interleaved",
            flush=True,
        )
        for case in selected:
            target_s = 0.5 if case.heavy else 0.05 if args.quick else 0.1
            repeats = heavy_repeats if case.heavy else light_repeats
            results += run_case(case, candidates, repeats, target_s, threads)
    print("\n" + results_table(results) + "\n\n" + summary_table(results, candidates) + "\n\ntargets:")
    print("\n".join(target_lines(results)))
    if args.json:
        args.json.write_text(
            json.dumps({"torch": torch.__version__, "results": [asdict(r) for r in results]}, indent=1)
        )
        print(f"wrote {args.json}")
    if args.png:
        print(save_png(results, candidates, args.png))
    return 0
