"""`python -m opgen.bench backend_cost`: where the time of a torch.compile(backend="opgen") call goes.

One process, CPU, 1 thread, no_grad, candidates interleaved (../shared/BENCH.md). Per graph case, the
median time per call of:

- **Inductor**: `torch.compile(model)`, through the same Dynamo;
- **backend**: `torch.compile(model, backend="opgen")`, the whole call;
- **AOT's function**: what Dynamo calls once its guards pass (AOT autograd's runtime wrapper around
  opgen's function), called directly with the arguments Dynamo passed it;
- **opgen's function**: what AOT calls (the frozen-weight check, then the compiled program), called
  directly with AOT's arguments;
- **opgen.compile**: the same model without Dynamo or AOT (its own input check included).

The parts follow by difference: Dynamo (its guards and frame handling) = backend - AOT's function;
AOT's wrapper = AOT's function - opgen's function. Both opgen candidates run the default backend
("auto": the C++ executor).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opgen.bench import models
from opgen.bench.timing import format_table, interleaved

PARTS = ("inductor", "backend", "aot", "function", "opgen_compile")
LABELS = {
    "inductor": "torch.compile (Inductor)",
    "backend": 'torch.compile(backend="opgen")',
    "aot": "AOT's function",
    "function": "opgen's function",
    "opgen_compile": "opgen.compile",
}
DEFAULT_CASES = ("gpt_block", "decode_step")


def _caught(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """The callables inside a torch.compile(backend="opgen") call, with the arguments each got."""
    from opgen.runtime.frontend import dynamo as dynamo_backend

    caught: dict[str, Any] = {}

    def spied(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            caught[name] = (fn, args)
            return fn(*args)

        return call

    def backend(gm: torch.fx.GraphModule, example: Sequence[Any]) -> Callable[..., Any]:
        original = dynamo_backend.compile_aten_graph
        dynamo_backend.compile_aten_graph = lambda *a, **k: spied("function", original(*a, **k))
        try:
            return spied("aot", dynamo_backend.opgen_backend(gm, example))
        finally:
            dynamo_backend.compile_aten_graph = original

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(*inputs)
    if set(caught) != {"aot", "function"}:
        raise RuntimeError(f"backend_cost: the case compiled to {len(caught)} of the 2 callables it times")
    return caught


def run_case(case: models.Case, repeats: int) -> list[float]:
    import opgen

    with torch.no_grad():
        inputs = case.inputs()
        caught = _caught(case.model(), inputs)  # first: the reset below leaves its function as it is
        torch._dynamo.reset()
        inductor = functools.partial(torch.compile(case.model()), *inputs)
        backend = functools.partial(torch.compile(case.model(), backend="opgen"), *inputs)
        calls = [
            inductor,
            backend,
            functools.partial(caught["aot"][0], *caught["aot"][1]),
            functools.partial(caught["function"][0], *caught["function"][1]),
            functools.partial(opgen.compile(case.model(), inputs), *inputs),
        ]
        for call in calls:
            call()
        timings = interleaved(calls, repeats=repeats, warmup=3, target_s=0.1)
    return [t.median_us for t in timings]


def table(rows: dict[str, list[float]]) -> str:
    headers = ["case", *(LABELS[p] for p in PARTS), "Dynamo", "AOT's wrapper", "backend / Inductor"]
    body = []
    for case, us in rows.items():
        inductor, backend, aot, function, _ = us
        body.append([case, *(f"{t:.1f}" for t in us), f"{backend - aot:.1f}", f"{aot - function:.1f}",
                     f"{backend / inductor:.3f}"])  # fmt: skip
    return format_table(headers, body)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench backend_cost", description=__doc__.split("\n\n")[0])
    names = [c.name for c in models.cases()]
    available = [n for n in DEFAULT_CASES if n in names]
    parser.add_argument("--cases", nargs="+", choices=names, default=available,
                        help=f"graph cases to break down (default: {', '.join(available)})")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per candidate (default 15)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(1)
    print(f"opgen backend_cost: torch {torch.__version__}, CPU, 1 thread, no_grad, interleaved; median us per call",
          flush=True)  # fmt: skip
    rows = {}
    for case in models.cases():
        if case.name in args.cases:
            rows[case.name] = run_case(case, args.repeats)
            print(f"  {case.name}: done", flush=True)
    print("\n" + table(rows))
    return 0
