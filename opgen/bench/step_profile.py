"""`python -m opgen.bench step`: where the time of one decode step goes, kernel by kernel.

One family of `opgen.bench.llm_families` in transformers' static-cache export wrapper (as `decode
--families` runs it), compiled with `opgen.compile` (CUDA graphs on CUDA), one step at `--position` of a
`--cache`-position cache, every row of the batch fed the same token. It prints the step's time (replayed
back to back: CUDA events on CUDA, the host's clock on the CPU) and a profile of one step, one row per
kernel: its name, what it is, its launches a step and a layer, and its time a launch and a step.

- On CUDA the rows are the GPU activities (kernels, copies, memsets; inside the CUDA graph too), named
  as the profiler names them. A generated kernel is named by its Triton function (`fused_..`,
  `gemm_rows_..`), and "what" is the report's description of it: the report gives each generated
  kernel's function in parentheses. A library kernel keeps its own name (cuBLAS's `nvjet_..`), with no
  description.
- With dependent launch on (Hopper and newer, `docs/jit-and-fusion.md`), a kernel starts before the one
  before it has finished, and its time includes that wait. The rows then overlap and add up to more
  than the step; the header says so. `OPGEN_DEPENDENT_LAUNCH=0` gives times that add up.
- On the CPU the rows are opgen's kernel calls (the executor's profiler ranges), one row per op. The
  ranges hold the profiler's own cost too, so they add up to more than the step.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from opgen.bench import leave_out
from opgen.bench.llm_families import FAMILIES, causal_lm, step
from opgen.bench.timing import format_table

REPEATS = 5  # timed samples of `--calls` steps each (`--repeats`); the median is reported
PROFILED = 5  # steps profiled; a row's figures are per step

_FUSED = re.compile(r"^fused \S+ \((?P<name>\w+)\): (?P<what>.*?), nodes ")
_NODE = re.compile(r"^node '(?P<node>[^']*)': (?P<kernel>\S+?),")


@dataclass(frozen=True, slots=True)
class Row:
    kernel: str  # as the profiler names it (on the CPU: the op)
    what: str  # the report's description of a generated kernel; "" for others
    launches: float  # a step
    us: float  # a step


@dataclass(frozen=True, slots=True)
class Profile:
    family: str
    size: str
    batch: int
    device: str  # "cpu", or the GPU's name
    dtype: str
    layers: int
    step_us: float
    dependent_launch: bool  # kernel times overlap (CUDA, Hopper and newer)
    rows: tuple[Row, ...]
    repeats: int = REPEATS
    left_out: tuple[str, ...] = ()  # passes of the default pipeline not run

    @property
    def work_us(self) -> float:
        return sum(r.us for r in self.rows)

    @property
    def launches(self) -> float:
        return sum(r.launches for r in self.rows)


def descriptions(jit_lines: Sequence[str]) -> dict[str, str]:
    """Kernel name -> what it is, from a report's JIT lines: each generated kernel's Triton function (in
    parentheses after its name) and each Triton kernel node's function."""
    found = {}
    for line in jit_lines:
        if (fused := _FUSED.match(line)) is not None:
            found[fused["name"]] = fused["what"]
        elif (node := _NODE.match(line)) is not None:
            found[node["kernel"].rsplit(":", 1)[-1]] = f"Triton kernel of node '{node['node']}'"
    return found


def profile_step(family: str, size: str, batch: int, cache: int, position: int, calls: int, device: torch.device,
                 dtype: torch.dtype, repeats: int = REPEATS, left_out: Sequence[str] = ()) -> Profile:  # fmt: skip
    """Build, compile (the pipeline `--leave-out` is checked against, without the passes `left_out`), time and
    profile one step of `family` (see the module)."""
    import opgen

    if not 0 <= position < cache:
        raise ValueError(f"position {position} is outside a cache of {cache} positions")
    cuda = device.type == "cuda"
    with torch.no_grad():
        lm = causal_lm(family, size, device=device, dtype=dtype)
        model = step(lm, cache, batch)
        inputs = (torch.zeros(batch, 1, dtype=torch.long, device=device), torch.tensor([position], device=device))
        passes = leave_out.pipeline(_pipeline_here(cuda)[0], left_out)
        fn = opgen.compile(model, inputs, cuda_graphs=cuda, passes=passes)
        for _ in range(3):  # the first call compiles its kernels and picks among them; then the graph replays
            fn(*inputs)
        step_us = step_time_us(lambda: fn(*inputs), calls, repeats, cuda)
        table = step_kernels(lambda: fn(*inputs), cuda)
        what = descriptions(fn.report().jit)
    return Profile(
        family, size, batch, torch.cuda.get_device_name(device) if cuda else "cpu", str(dtype).removeprefix("torch."),
        int(lm.config.num_hidden_layers), step_us, cuda and dependent_launch(),
        ranked(table, what), repeats, tuple(left_out),
    )  # fmt: skip


def ranked(table: dict[str, tuple[float, float]], what: dict[str, str]) -> tuple[Row, ...]:
    """`step_kernels`' table as rows, each kernel described by `what` (`descriptions`), the longest first."""
    return tuple(sorted((Row(k, what.get(k, ""), n, us) for k, (us, n) in table.items()), key=lambda r: -r.us))


def step_time_us(call: Callable[[], Any], calls: int, repeats: int, cuda: bool) -> float:
    """Median over `repeats` samples of `calls` steps back to back, per step."""
    samples = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                call()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / calls)
        else:
            begin = time.perf_counter()
            for _ in range(calls):
                call()
            samples.append((time.perf_counter() - begin) * 1e6 / calls)
    return statistics.median(samples)


def step_kernels(call: Callable[[], Any], cuda: bool) -> dict[str, tuple[float, float]]:
    """Kernel -> (us, launches) a step: the GPU's activities on CUDA, opgen's kernel calls on the CPU."""
    from torch.profiler import ProfilerActivity

    from opgen.bench.gpu_work import activity_table, kernel_table

    if cuda:
        return kernel_table(call, PROFILED)

    def op(event: Any) -> str | None:
        # The executor's ranges: `opgen::<node> (<op>)` per kernel call, `opgen::<fn> (<model>, graph ..)` around them.
        found = re.fullmatch(r"opgen::\S+ \((?P<op>[^,()]+)\)", event.name)
        return found["op"] if found is not None else None

    return activity_table(call, PROFILED, ProfilerActivity.CPU, op)


def dependent_launch() -> bool:
    from opgen.runtime.execution.device_facts import device_facts

    return device_facts().dependent_launch


def report(p: Profile, rows: int) -> str:
    """The header lines and the table of the `rows` longest kernels (the rest summed in one line)."""
    family = FAMILIES.get(p.family)  # `tp_step` profiles a rank of its own model, not a family
    widths = family.widths(p.size) if family is not None else f"{p.size} widths"
    clock = "CUDA events" if p.device != "cpu" else "the host's clock"
    lines = [
        f"{p.family} ({widths}), batch {p.batch}, {p.dtype} on {p.device}{leave_out.without(p.left_out)}: "
        f"a step takes {p.step_us:.1f} us "
        f"(steps back to back, {clock}; median of {p.repeats})",
        f"one step's {'GPU activities' if p.device != 'cpu' else 'kernel calls'}: {p.work_us:.1f} us in "
        f"{p.launches:.0f} launches, {p.launches / max(p.layers, 1):.1f} a layer ({p.layers} layers)",
    ]
    if p.dependent_launch:
        lines.append("dependent launch is on: each kernel's time includes its wait for the one before, so the "
                     "rows overlap (OPGEN_DEPENDENT_LAUNCH=0 for times that add up)")  # fmt: skip
    shown, rest = p.rows[:rows], p.rows[rows:]
    layers, total = max(p.layers, 1), max(p.work_us, 1e-9)
    cells = [
        [r.kernel[:60], r.what[:90], f"{r.launches:.1f}", f"{r.launches / layers:.2f}",
         f"{r.us / r.launches:.2f}" if r.launches else "-", f"{r.us:.1f}", f"{100 * r.us / total:.1f}%"]
        for r in shown
    ]  # fmt: skip
    if rest:
        us, n = sum(r.us for r in rest), sum(r.launches for r in rest)
        cells.append([f"({len(rest)} more)", "", f"{n:.1f}", f"{n / layers:.2f}", "-", f"{us:.1f}",
                      f"{100 * us / total:.1f}%"])  # fmt: skip
    headers = ["kernel", "what", "launches a step", "a layer", "us a launch", "us a step", "share"]
    if not any(r.what for r in p.rows):  # the CPU's rows are ops: nothing to say about them
        headers, cells = headers[:1] + headers[2:], [c[:1] + c[2:] for c in cells]
    return "\n".join([*lines, format_table(headers, cells)])


def _pipeline_here(cuda: bool) -> tuple[tuple[str, ...], str]:
    """The passes that can act on this step (the JIT's act on CUDA values only), and why the JIT's are missing."""
    from opgen.runtime.passes import JIT_PASSES
    from opgen.runtime.pipeline import default_pipeline

    passes = default_pipeline()
    if not cuda:
        cpu = tuple(p for p in passes if p not in JIT_PASSES)
        return cpu, "opgen's JIT passes act on CUDA only; this step runs on the CPU"
    return passes, "opgen's JIT cannot run here: no CUDA build or triton"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="llama", choices=sorted(FAMILIES))
    parser.add_argument("--size", choices=("real", "tiny"), help="default: real widths on CUDA, tiny on the CPU")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cache", type=int, default=128, help="positions of the static cache")
    parser.add_argument("--position", type=int, default=64, help="the step's position in the cache")
    parser.add_argument("--calls", type=int, default=50, help="steps back to back per timed sample")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed samples (the median is reported)")
    parser.add_argument("--rows", type=int, default=30, help="kernels shown, the longest first")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--json", help="write the profile here")
    leave_out.add_argument(parser)
    args = parser.parse_args(argv)
    if min(args.batch, args.calls, args.repeats, args.rows) < 1:
        parser.error("--batch, --calls, --repeats and --rows take positive numbers")
    if not 0 <= args.position < args.cache:
        parser.error(f"--position {args.position} is outside a cache of {args.cache} positions")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    leave_out.check(parser, args.leave_out, *_pipeline_here(cuda))
    device = torch.device("cuda" if cuda else "cpu")
    size = args.size or ("real" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    p = profile_step(args.family, size, args.batch, args.cache, args.position, args.calls, device, dtype, args.repeats,
                     args.leave_out)  # fmt: skip
    print(report(p, args.rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(_as_json(p), f, indent=1)
    return 0


def _as_json(p: Profile) -> Mapping[str, Any]:
    return {**asdict(p), "work_us": p.work_us, "launches": p.launches}
