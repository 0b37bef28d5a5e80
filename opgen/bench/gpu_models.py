"""`python -m opgen.bench gpu_models`: real models from torchvision, timm and transformers on the GPU.

Models (gpu_model_zoo.py) with random weights, no_grad, torch's default numerics. Candidates: eager,
torch.compile default (Inductor) and reduce-overhead, opgen.compile plain and with cuda_graphs=True.
Per model and candidate: **sync us**, N calls then one synchronize, per call, candidates interleaved
(../shared/BENCH.md); **kernel us** and **launches**, the GPU work of one call (the profiler's
kernels, memsets and copies); **first call s**, build plus first call(s), synchronized, with cold
disk caches (each model gets fresh Inductor, Triton and opgen cache folders, so Inductor default and
opgen plain compile everything; reduce-overhead and opgen's graph mode come after them and reuse what
their plain twin wrote); **rel err**, max |out - eager| / max |eager|. A candidate that fails is a row
with the reason; a model whose library is missing is skipped with the reason.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from opgen.bench import gpu_model_zoo as zoo
from opgen.bench.gpu_work import kernel_table, totals
from opgen.bench.graphs_cuda import build_candidate, ready
from opgen.bench.plots import ratio_bars
from opgen.bench.timing import format_table, interleaved, target_line

CANDIDATES = ("eager", "inductor", "reduce_overhead", "opgen", "opgen_graphs")
LABELS = {
    "eager": "eager",
    "inductor": "Inductor default",
    "reduce_overhead": "reduce-overhead",
    "opgen": "opgen plain",
    "opgen_graphs": "opgen cuda_graphs",
}
BUILT_AS = {"opgen": "opgen_default"}  # plain mode as opgen.compile runs it by default
FIRST_CALLS = {"reduce_overhead": 3}  # cudagraph trees warm up, then record on a later call
# Relative error allowed against eager, as Inductor's own benchmark harness allows (1e-3 in float32,
# 1e-2 in half precision); bfloat16's 8-bit mantissa gets twice float16's.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "OPGEN_CACHE_DIR")


@dataclass(frozen=True, slots=True)
class Result:
    model: str
    candidate: str
    sync_us: float | None = None
    kernel_us: float | None = None
    launches: float | None = None
    first_call_s: float | None = None
    rel_err: float | None = None
    failed: str | None = None  # why the candidate did not run


def rel_error(out: Any, ref: Any) -> float:
    from torch.utils import _pytree

    worst = 0.0
    for o, r in zip(_pytree.tree_leaves(out), _pytree.tree_leaves(ref), strict=True):
        if isinstance(r, torch.Tensor) and r.numel():
            scale = float(r.float().abs().max()) or 1.0
            worst = max(worst, float((o.float() - r.float()).abs().max()) / scale)
    return worst


def cold_caches(root: Path, model: str) -> None:
    """Point Inductor, Triton and opgen at empty cache folders of their own for this model."""
    for variable in CACHE_VARIABLES:
        folder = root / model / variable.lower()
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(folder)


def run_model(entry: zoo.GpuModel, candidates: Sequence[str], calls: int, repeats: int, cache_root: Path | None,
              progress: Callable[[str], None], device: torch.device | None = None,
              kernels: int = 0) -> list[Result]:  # fmt: skip
    device = device or torch.device("cuda")
    results: list[Result] = []
    with torch.no_grad():
        model, inputs = entry.build(device)
        reference = model(*inputs)
        if cache_root is not None:
            cold_caches(cache_root, entry.name)
        # One reset per model, before any candidate: a reset also resets the CUDA-graph trees of a
        # reduce-overhead model built before it, which later replays through freed memory.
        torch._dynamo.reset()
        running: list[tuple[str, Callable[[], Any], float, float, tuple[float, float]]] = []
        for name in candidates:
            try:
                build = functools.partial(build_candidate, BUILT_AS.get(name, name), model, inputs)
                call, out, seconds = ready(build, FIRST_CALLS.get(name, 1))
                for _ in range(3):
                    call()
                table = kernel_table(call, calls)
            except Exception as exc:  # a candidate that fails is a row, not the end of the run
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
                progress(f"  {entry.name}: {LABELS[name]} FAILED: {why}")
                traceback.print_exc(limit=3)
                results.append(Result(entry.name, name, failed=why))
                continue
            err, work = rel_error(out, reference), totals(table)
            running.append((name, call, seconds, err, work))
            progress(f"  {entry.name}: {LABELS[name]}: first call {seconds:.1f} s, {work[0]:.0f} us of GPU work in "
                     f"{work[1]:.0f} launches, rel err {err:.1e}")  # fmt: skip
            if kernels and name != "eager":  # the most expensive kernels of the same profile
                for kernel, (us, launches) in sorted(table.items(), key=lambda item: -item[1][0])[:kernels]:
                    progress(f"    {us:8.1f} us {launches:5.1f}x  {kernel[:110]}")
        timings = interleaved([c for _, c, *_ in running], repeats=repeats, warmup=3, target_s=0.1,
                              sync=torch.cuda.synchronize)  # fmt: skip
        for (name, _, seconds, err, (kernel_us, launches)), timing in zip(running, timings, strict=True):
            results.append(Result(entry.name, name, timing.median_us, kernel_us, launches, seconds, err))
    order = {name: i for i, name in enumerate(candidates)}
    return sorted(results, key=lambda r: order[r.candidate])


def _num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def results_table(results: Sequence[Result]) -> str:
    headers = ["model", "candidate", "sync us", "x eager", "GPU kernel us", "launches", "first call s", "rel err"]
    eager = {r.model: r.sync_us for r in results if r.candidate == "eager" and r.sync_us}
    rows = []
    for r in results:
        if r.failed is not None:
            rows.append([r.model, LABELS[r.candidate], f"failed: {r.failed}", "", "", "", "", ""])
            continue
        ratio = f"{r.sync_us / eager[r.model]:.3f}" if r.sync_us and r.model in eager else ""
        rows.append([r.model, LABELS[r.candidate], _num(r.sync_us), ratio, _num(r.kernel_us), _num(r.launches),
                     _num(r.first_call_s, 1), f"{r.rel_err:.1e}"])  # fmt: skip
    return format_table(headers, rows)


def target_lines(results: Sequence[Result]) -> list[str]:
    """The GPU-real-models issue's definition of done (and the LLM issue's graph-mode table), as measured."""
    by = {(r.model, r.candidate): r for r in results if r.failed is None}
    dtypes = {m.name: m.dtype for m in zoo.MODELS}
    lines = []
    for model in dict.fromkeys(r.model for r in results):
        graphs, reduce_overhead = _pair(by, model, "opgen_graphs", "reduce_overhead")
        if graphs and reduce_overhead:
            ratio = graphs.sync_us / reduce_overhead.sync_us  # type: ignore[operator]
            lines.append(target_line(f"{model} graph mode / reduce-overhead", ratio, 1))
        plain, inductor = _pair(by, model, "opgen", "inductor")
        if plain and inductor:
            lines.append(target_line(f"{model} plain / Inductor default", plain.sync_us / inductor.sync_us, 1))  # type: ignore[operator]
            lines.append(target_line(f"{model} first call / Inductor's cold compile",
                                     plain.first_call_s / inductor.first_call_s, 0.5))  # type: ignore[operator]  # fmt: skip
        tolerance = TOLERANCE[dtypes[model]]
        for name in ("opgen", "opgen_graphs"):
            if (r := by.get((model, name))) is not None:
                lines.append(target_line(f"{model} {LABELS[name]} rel err", r.rel_err, tolerance))  # type: ignore[arg-type]
        failed = [LABELS[r.candidate] for r in results if r.model == model and r.failed and "opgen" in r.candidate]
        if failed:
            lines.append(f"  {model}: {', '.join(failed)} failed: NOT met")
    return lines


def _pair(by: dict[tuple[str, str], Result], model: str, ours: str, theirs: str) -> tuple[Result | None, Result | None]:
    a, b = by.get((model, ours)), by.get((model, theirs))
    return (a, b) if a and b else (None, None)


def save_png(results: Sequence[Result], candidates: Sequence[str], path: Path) -> str:
    eager = {r.model: r.sync_us for r in results if r.candidate == "eager" and r.sync_us}
    models = [m for m in dict.fromkeys(r.model for r in results) if m in eager]
    ratio = {(r.model, r.candidate): r.sync_us / eager[r.model] for r in results if r.sync_us and r.model in eager}
    title = f"opgen gpu_models, {torch.cuda.get_device_name()}"
    ylabel = "sync time per call / eager (log; lower is faster)"
    return ratio_bars(ratio, models, candidates, LABELS, path, ylabel=ylabel, title=title, rotation=20)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench gpu_models", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=zoo.NAMES, default=list(zoo.NAMES), help="default: all")
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=list(CANDIDATES),
                        help="default: all (eager always runs)")  # fmt: skip
    parser.add_argument("--calls", type=int, default=10, help="calls profiled per candidate (default 10)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per candidate (default 5)")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also print each compiled candidate's N most expensive GPU kernels")  # fmt: skip
    parser.add_argument(
        "--warm-caches",
        action="store_true",
        help="keep the usual Inductor/Triton/opgen cache folders (default: fresh ones per model)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--png", type=Path, help="also write a bar chart of time / eager (needs matplotlib)")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("gpu_models needs a CUDA GPU")
    candidates = ["eager"] + [c for c in args.candidates if c != "eager"]
    print(f"opgen gpu_models: torch {torch.__version__}, {torch.cuda.get_device_name()}, no_grad", flush=True)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="opgen-gpu-models-") as tmp:
        root = None if args.warm_caches else Path(tmp)
        for entry in zoo.MODELS:
            if entry.name not in args.models:
                continue
            if (why := entry.missing()) is not None:
                print(f"  {entry.name}: skipped ({why})", flush=True)
                continue
            print(f"{entry.what}", flush=True)
            results += run_model(entry, candidates, args.calls, args.repeats, root, lambda s: print(s, flush=True),
                                 kernels=args.kernels)  # fmt: skip
            torch.cuda.empty_cache()
    print("\n" + results_table(results) + "\n\ntargets:\n" + "\n".join(target_lines(results)))
    if args.json:
        payload = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                   "results": [asdict(r) for r in results]}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"wrote {args.json}")
    if args.png:
        print(save_png(results, candidates, args.png))
    return 0
