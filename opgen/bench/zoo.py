"""`python -m opgen.bench zoo`: the model zoo (zoo_models.py) through eager, opgen and Inductor.

One process, one thread by default (`--threads N`), every call under torch.no_grad(). Per model:
eager time, and the ratio to eager (in the same interleaved run) of `opgen.compile(...,
fallback=False)` and of `torch.compile` with Inductor where it compiles. Compile times are
reported separately, never mixed into the steady-state figures. Needs the `zoo` extra.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import opgen
from opgen.bench.timing import format_table, interleaved


def _timed_compile(make: Callable[[], Callable[[], Any]]) -> tuple[Callable[[], Any] | None, float, str]:
    start = time.perf_counter()
    try:
        fn = make()
        fn()  # first call: Inductor compiles here
    except Exception as exc:  # a compiler's failure is a row entry, not the end of the table
        return None, time.perf_counter() - start, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return fn, time.perf_counter() - start, ""


def bench_model(name: str, inductor: bool, repeats: int) -> list[object]:
    from opgen.bench.zoo_models import BY_NAME

    model, inputs = BY_NAME[name].build()
    compiled, opgen_s, opgen_err = _timed_compile(lambda: _bound(opgen.compile(model, inputs), inputs))
    if compiled is None:
        return [name, "-", f"fails: {opgen_err}", "-", f"{opgen_s:.1f}", "-"]
    candidates = [lambda: model(*inputs), compiled]
    ind, ind_s, ind_err = None, 0.0, "off"
    if inductor:
        torch._dynamo.reset()
        ind, ind_s, ind_err = _timed_compile(lambda: _bound(torch.compile(model), inputs))
        if ind is not None:
            candidates.append(ind)
    timings = interleaved(candidates, repeats=repeats)
    eager = timings[0]
    ind_cell = f"{timings[2].ratio_to(eager):.2f}x" if ind is not None else f"- ({ind_err})"
    return [
        name,
        f"{eager.median_us:.0f} ({eager.min_us:.0f}-{eager.max_us:.0f})",
        f"{timings[1].ratio_to(eager):.2f}x",
        ind_cell,
        f"{opgen_s:.1f}",
        f"{ind_s:.1f}" if ind is not None else "-",
    ]


def _bound(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    return lambda: fn(*inputs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench zoo", description=__doc__)
    parser.add_argument("models", nargs="*", help="model names (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats per candidate (default 7)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (it takes minutes)")
    args = parser.parse_args(argv)
    from opgen.bench.zoo_models import ZOO  # needs transformers (the zoo extra); --help does not

    torch.set_num_threads(args.threads)
    names = args.models or [m.name for m in ZOO]
    rows = []
    with torch.no_grad():
        for name in names:
            rows.append(bench_model(name, not args.no_inductor, args.repeats))
            print(f"done {name}", flush=True)
    headers = [
        "model",
        "eager us (min-max)",
        "opgen / eager",
        "inductor / eager",
        "opgen compile s",
        "inductor compile s",
    ]
    print(f"\nmodel zoo, CPU, {args.threads} thread(s), median of {args.repeats} interleaved repeats")
    print(format_table(headers, rows))
    ratios = [float(str(r[2]).rstrip("x")) for r in rows if str(r[2]).endswith("x")]
    if ratios:
        print(f"median opgen/eager over {len(ratios)} models: {statistics.median(ratios):.2f}x")
    return 0
