"""`python -m opgen.bench step_ncu`: one decode step's kernels under Nsight Compute, each replayed alone.

`python -m opgen.bench step` times a step's kernels in place; this command says why a kernel takes its
time. The step (a family of `opgen.bench.llm_families` in transformers' static-cache wrapper, `--layers`
decoder layers, compiled with `opgen.compile(cuda_graphs=True)`) is built, compiled and warmed in a child
process that `ncu` runs; the child then replays the step once between `cudaProfilerStart` and
`cudaProfilerStop`, and `ncu` profiles each kernel of that replay (each node of the CUDA graph) alone, its
caches flushed first: the weights come from memory, as in a step. One row a kernel, in the step's order: its
name, what the report says it is, programs (CUDA blocks) and threads each, registers a thread and dynamic
shared memory a program, its time alone, the bytes it read from DRAM and their rate, DRAM throughput and
active warps as % of the GPU's peak. A narrow product whose programs leave SMs idle shows here as few
programs and few active warps (`docs/jit-and-fusion.md`).

Needs a GPU and Nsight Compute's `ncu` (on PATH, under /usr/local/cuda/bin, or `--ncu`) with access to the
GPU's performance counters.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from opgen.bench.llm_families import FAMILIES
from opgen.bench.timing import format_table

# ncu's metrics, in base units (`--print-units base`): ns, bytes, %, counts.
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
)
WHAT = "OPGEN_NCU_WHAT "  # the child's line of kernel descriptions (JSON), among ncu's output
CUDA_NCU = "/usr/local/cuda/bin/ncu"


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    what: str
    programs: int
    threads: int
    registers: int
    shared: int  # bytes of dynamic shared memory a program
    us: float
    dram_read: float  # bytes
    dram_pct: float
    warps_pct: float


def parse(output: str) -> list[Kernel]:
    """The kernels of `ncu --csv --page details --print-units base` output, in profiling order, each described
    by the child's `WHAT` line."""
    what: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith(WHAT):
            what = json.loads(line[len(WHAT) :])
    start = output.find('"ID","')
    if start < 0:
        why = "no kernel ran between cudaProfilerStart and Stop?"
        raise RuntimeError(f"ncu printed no profile ({why}):\n{_tail(output)}")
    metrics: dict[tuple[int, str, str, str], dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO(output[start:])):
        if not (row.get("ID") or "").isdigit() or row.get("Metric Name") not in METRICS:
            continue
        value = (row.get("Metric Value") or "").replace(",", "")
        key = (int(row["ID"]), row["Kernel Name"], row["Grid Size"], row["Block Size"])
        metrics.setdefault(key, {})[row["Metric Name"]] = float(value or "nan")
    kernels = []
    for (_, name, grid, block), m in sorted(metrics.items()):
        kernels.append(Kernel(
            name, what.get(name, ""), _volume(grid), _volume(block),
            int(m.get("launch__registers_per_thread", 0)), int(m.get("launch__shared_mem_per_block_dynamic", 0)),
            m.get("gpu__time_duration.sum", float("nan")) / 1e3, m.get("dram__bytes_read.sum", float("nan")),
            m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", float("nan")),
            m.get("sm__warps_active.avg.pct_of_peak_sustained_active", float("nan")),
        ))  # fmt: skip
    if not kernels:
        raise RuntimeError("ncu's profile held none of the metrics asked for:\n" + _tail(output))
    return kernels


def _volume(dims: str) -> int:
    """Blocks or threads of ncu's "(x, y, z)"."""
    n = 1
    for d in dims.strip("()").split(","):
        n *= int(d)
    return n


def report(kernels: Sequence[Kernel], header: str) -> str:
    cells = [
        [k.name[:40], k.what[:70], k.programs, k.threads, k.registers, f"{k.shared / 1024:.0f}", f"{k.us:.2f}",
         f"{k.dram_read / 1e6:.2f}", f"{k.dram_read / max(k.us, 1e-9) / 1e3:.0f}", f"{k.dram_pct:.1f}",
         f"{k.warps_pct:.1f}"]
        for k in kernels
    ]  # fmt: skip
    headers = ["kernel", "what", "programs", "threads", "regs", "shared KB", "us alone", "DRAM read MB", "GB/s",
               "% DRAM peak", "% warps active"]  # fmt: skip
    return "\n".join([header, format_table(headers, cells)])


def find_ncu(given: str | None) -> str | None:
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("ncu") or (CUDA_NCU if os.access(CUDA_NCU, os.X_OK) else None)


def run_ncu(command: Sequence[str], timeout: float) -> tuple[int, str]:
    """(exit status, output) of ncu and its child, their lines merged; ncu's own lines (`==PROF==`: each kernel
    as it is profiled) echoed to stderr as they come, as the progress of a run of minutes."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    killed = threading.Event()

    def kill() -> None:  # ncu and the child it runs: their own process group
        killed.set()
        _kill_group(proc)

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("==PROF=="):
                print(line, end="", file=sys.stderr, flush=True)
        status = proc.wait()
    finally:  # also on Ctrl-C: no ncu or child left holding the GPU
        timer.cancel()
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
    if killed.is_set():
        raise RuntimeError(f"ncu did not finish within {timeout:.0f} s (--timeout)")
    return status, "".join(lines)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _child(args: argparse.Namespace) -> int:
    """Build, compile and warm the step, then replay it once for ncu."""
    import opgen
    from opgen.bench.llm_families import causal_lm, step
    from opgen.bench.step_profile import descriptions

    device = torch.device("cuda")
    with torch.no_grad():
        lm = causal_lm(args.family, "real", device=device, dtype=torch.bfloat16, layers=args.layers)
        model = step(lm, args.cache, args.batch)
        inputs = (torch.zeros(args.batch, 1, dtype=torch.long, device=device),
                  torch.tensor([args.position], device=device))  # fmt: skip
        fn = opgen.compile(model, inputs, cuda_graphs=True)
        for _ in range(3):  # the first call compiles its kernels and picks among them; then the graph replays
            fn(*inputs)
        torch.cuda.synchronize()
        print(WHAT + json.dumps(descriptions(fn.report().jit)), flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        fn(*inputs)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench step_ncu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="llama", choices=sorted(FAMILIES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (each is replayed under ncu)")
    parser.add_argument("--cache", type=int, default=128, help="positions of the static cache")
    parser.add_argument("--position", type=int, default=64, help="the step's position in the cache")
    parser.add_argument("--ncu", help="Nsight Compute's ncu (default: on PATH, or " + CUDA_NCU + ")")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole profile")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.batch, args.layers) < 1:
        parser.error("--batch and --layers take positive numbers")
    if not 0 <= args.position < args.cache:
        parser.error(f"--position {args.position} is outside a cache of {args.cache} positions")
    if not torch.cuda.is_available():
        parser.error("needs a GPU: no CUDA device is visible")
    if args.child:
        return _child(args)
    ncu = find_ncu(args.ncu)
    if ncu is None:
        where = f"--ncu {args.ncu} is not an executable" if args.ncu else f"not on PATH nor at {CUDA_NCU}"
        parser.error(f"Nsight Compute's ncu not found: {where}")
    child = [sys.executable, "-m", "opgen.bench", "step_ncu", "--child", "--family", args.family, "--batch",
             str(args.batch), "--layers", str(args.layers), "--cache", str(args.cache), "--position",
             str(args.position)]  # fmt: skip
    command = [ncu, "--profile-from-start", "off", "--graph-profiling", "node", "--metrics", ",".join(METRICS),
               "--csv", "--page", "details", "--print-units", "base", *child]  # fmt: skip
    print(f"profiling {args.family} (batch {args.batch}, {args.layers} layers) under {ncu}: building, compiling, "
          "then each kernel of one step replayed alone...", file=sys.stderr, flush=True)  # fmt: skip
    status, output = run_ncu(command, args.timeout)
    if status != 0:
        raise RuntimeError(f"ncu exited with status {status}:\n{_tail(output)}")
    kernels = parse(output)
    name = torch.cuda.get_device_name()
    total = sum(k.us for k in kernels)
    header = f"{args.family}, batch {args.batch}, {args.layers} layers, bfloat16 on {name}: {len(kernels)} kernels, "
    print(report(kernels, header + f"{total:.1f} us alone in all (caches flushed before each)"))
    return 0
