"""`python -m opgen.bench jit`: host time per launch of a trivial Triton kernel (GPU).

The kernel adds two 16-element float32 vectors. Launched four ways, interleaved in one process:
- opgen: the launcher `opgen.jit.kernel(...)` returns, called from Python;
- triton: Triton's own `kernel[grid](...)`;
- inductor: torch Inductor's static launcher (`StaticallyLaunchedCudaKernel.run`), with the raw
  stream fetched per call as Inductor's generated wrappers do once per graph call;
- bare: a C++ loop of cuLaunchKernel with the arguments packed once (the floor; loop timing only).

Two timings (BENCH.md): **enqueue** is one call alone, the GPU idle, sync outside the timed region;
**loop** is N back-to-back calls then one synchronize, per call. First-call compile and autotune
times are measured separately, with empty caches.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from opgen.bench.timing import Timing, format_table, interleaved

N = 16
BLOCK = 16


def _kernels() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)

    return add_kernel, scale_kernel


def _inductor_launcher(compiled: Any, args: tuple[Any, ...]) -> tuple[Callable[[], object] | None, str]:
    """Inductor's static launcher around the binary Triton compiled, or None and why not."""
    try:
        from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
    except ImportError:
        try:
            from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
        except ImportError as exc:
            return None, f"not in this torch ({exc})"
    try:
        if not hasattr(compiled, "_cubin_path"):
            compiled._cubin_path = None
        launcher = StaticallyLaunchedCudaKernel(compiled)
        path = os.path.join(tempfile.mkdtemp(prefix="opgen-bench-"), "kernel.cubin")
        launcher.reload_cubin_from_raw(path)
        launcher.load_kernel(torch.cuda.current_device())
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    raw_stream = torch._C._cuda_getCurrentRawStream
    device = torch.cuda.current_device()

    def run() -> None:
        launcher.run(1, 1, 1, raw_stream(device), *args)

    return run, ""


def steady_state(repeats: int) -> list[list[object]]:
    import opgen.jit

    add_kernel, _ = _kernels()
    x = torch.randn(N, device="cuda")
    y = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    args = (x, y, out, N)
    ours = opgen.jit.kernel(add_kernel, (1,), BLOCK=BLOCK)
    ours(*args)
    compiled = add_kernel[(1,)](*args, BLOCK=BLOCK)
    torch.testing.assert_close(out, x + y)
    inductor, why_not = _inductor_launcher(compiled, args)
    runs: dict[str, Callable[[], object]] = {
        "opgen": lambda: ours(*args),
        "triton": lambda: add_kernel[(1,)](*args, BLOCK=BLOCK),
    }
    if inductor is not None:
        runs["inductor static launcher"] = inductor
    sync = torch.cuda.synchronize
    enqueue = dict(zip(runs, interleaved(list(runs.values()), repeats, sync=sync, enqueue=True), strict=True))
    loop = dict(zip(runs, interleaved(list(runs.values()), repeats, sync=sync, target_s=0.005), strict=True))
    native = opgen.jit.env.native()
    bare_samples = []
    for _ in range(repeats):
        bare_samples.append(native.jit_bench_bare(ours, 2000, *args) * 1e6)
        sync()
    bare_samples.sort()
    bare = Timing(bare_samples[len(bare_samples) // 2], bare_samples[0], bare_samples[-1])
    rows: list[list[object]] = []
    for name in runs:
        rows.append(_row(name, enqueue[name], loop[name], enqueue["triton"], loop["triton"], bare))
    rows.append(["bare cuLaunchKernel loop (C++)", "-", "-", "-", bare.median_us, _span(bare), "-", "1.000"])
    if inductor is None:
        rows.append(["inductor static launcher", "n/a", why_not, "", "", "", "", ""])
    return rows


def _span(t: Timing) -> str:
    return f"{t.min_us:.2f}-{t.max_us:.2f}"


def _row(name: str, enq: Timing, loop: Timing, enq_triton: Timing, loop_triton: Timing, bare: Timing) -> list[object]:
    return [name, enq.median_us, _span(enq), f"{enq.ratio_to(enq_triton):.3f}", loop.median_us, _span(loop),
            f"{loop.ratio_to(loop_triton):.3f}", f"{loop.ratio_to(bare):.3f}"]  # fmt: skip


def first_calls() -> list[list[object]]:
    """Cold compile and autotune times, then the same kernels again from opgen's disk cache."""
    import opgen.jit
    from opgen.jit import Config

    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OPGEN_CACHE_DIR"] = cache
        _, scale_kernel = _kernels()  # a fresh JITFunction: nothing compiled in this process
        x = torch.randn(1 << 20, device="cuda")
        out = torch.empty_like(x)
        n = x.numel()
        configs = [Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 2), (1024, 4), (2048, 8), (4096, 8))]

        def grid(meta: dict[str, Any]) -> tuple[int]:
            return ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)

        for label, kwargs in (("1 config (compile)", {"BLOCK": 1024}), ("4 configs (compile + autotune)", {})):
            for attempt in ("cold caches", "opgen disk cache"):
                before = opgen.jit.stats()
                launch = opgen.jit.kernel(scale_kernel, grid, configs=None if kwargs else configs, **kwargs)
                torch.cuda.synchronize()
                start = time.perf_counter()
                launch(x, out, n, 2.0)
                torch.cuda.synchronize()
                took = time.perf_counter() - start
                after = opgen.jit.stats()
                done = {k: after[k] - before[k] for k in ("compiles", "cache_hits", "tunes", "tune_hits")}
                rows.append([label, attempt, f"{took:.3f}", done["compiles"], done["cache_hits"], done["tunes"],
                             done["tune_hits"], f"{after['compile_seconds'] - before['compile_seconds']:.3f}",
                             f"{after['tune_seconds'] - before['tune_seconds']:.3f}"])  # fmt: skip
        torch.testing.assert_close(out, 2 * x)
        _, fresh = _kernels()
        start = time.perf_counter()
        fresh[grid](x, out, n, 2.0, BLOCK=1024)
        torch.cuda.synchronize()
        rows.append(["triton kernel[grid] first call", "cold caches", f"{time.perf_counter() - start:.3f}",
                     "", "", "", "", "", ""])  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench jit", description=__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per launcher and timing (default 7)")
    args = parser.parse_args(argv)
    import opgen.jit

    if not opgen.jit.available():
        parser.error("needs " + "; ".join(opgen.jit.missing()))
    # Triton's own cache starts empty too, so the first-call figures are cold (read when triton loads).
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="opgen-bench-triton-")
    import triton

    print(f"opgen JIT launch benchmark: torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}; a {N}-element add, grid (1,)", flush=True)  # fmt: skip
    rows = steady_state(args.repeats)
    headers = ["launch", "enqueue us", "(min-max)", "x triton", "loop us", "(min-max)", "x triton", "x bare"]
    print("\nhost time per launch\n" + format_table(headers, rows))
    first = first_calls()
    headers = ["first call", "caches", "seconds", "compiles", "cache hits", "tunes", "tune hits", "compile s",
               "tune s"]  # fmt: skip
    print("\nfirst calls (a 1M-element scale kernel)\n" + format_table(headers, first))
    return 0
