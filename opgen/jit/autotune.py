"""Autotuning: the first call with real arguments times every config and keeps the fastest.

Timing runs on copies of the arguments the kernel writes (those it declares, or every tensor when
it declares none), so the caller's tensors are written once, by the real launch after the pick.
The pick is stored in the JIT cache, keyed by the configs' binaries and the argument sizes, so a
second process tunes nothing.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch

from opgen.jit import cache, compiler, env
from opgen.jit.binary import KernelBinary
from opgen.jit.specialize import Specialization

if TYPE_CHECKING:
    from opgen.jit.kernels import JitKernel


def size_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a pick depends on besides the binaries: tensor sizes, strides and dtypes, other values."""
    return tuple(
        (tuple(a.shape), tuple(a.stride()), str(a.dtype)) if isinstance(a, torch.Tensor) else repr(a) for a in args
    )


def pick(
    kernel: JitKernel,
    args: Sequence[Any],
    specs: Sequence[Specialization],
    futures: Sequence[concurrent.futures.Future[KernelBinary]],
    device: int,
) -> tuple[int, str]:
    keys = [compiler.binary_key(kernel.fn, s, c.options, device) for s, c in zip(specs, kernel.configs, strict=True)]
    key = cache.make_key(("tune", keys, size_key(args)))
    record = cache.load_pick(key)
    if record is not None and 0 <= record.get("index", -1) < len(keys):
        cache.STATS.add("tune_hits")
        return record["index"], "autotune pick from the cache"
    start = time.perf_counter()
    pairs = zip(futures, kernel.configs, strict=True)
    timings = [_time_config(kernel, future.result(), config, args) for future, config in pairs]
    index = min(range(len(timings)), key=timings.__getitem__)
    cache.STATS.add("tunes")
    cache.STATS.add("tune_seconds", time.perf_counter() - start)
    cache.store_pick(key, {"index": index, "timings_us": timings})
    shown = ", ".join(f"{t:.1f}" for t in timings)
    return index, f"autotuned on the first call (us per launch: {shown})"


def _time_config(kernel: JitKernel, binary: KernelBinary, config: Any, args: Sequence[Any]) -> float:
    native = env.native()
    scratch = native.JitLauncher(kernel.name, len(args), None)
    kernel.add_variant(binary, config, args, into=scratch)
    written = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if kernel.mutates is not None:
        written = [i for i in written if i in kernel.mutates]
    return median_us(lambda *copies: native.jit_launch_strict(scratch, *copies), args, written)


# do_bench's spans per timing (ms): warm-up, then timed launches, each after an L2 flush (~0.1 ms on an
# H100), so a kernel of 5-100 us gets about 40 timed launches: a stable median. A model's first call
# times every config of every new kernel and every multi-kernel candidate, so these spans are most of
# it (Triton's defaults, 25 and 100 ms, would make a transformer's first call minutes long).
WARMUP_MS, TIMED_MS = 1, 5


def median_us(fn: Callable[..., Any], args: Sequence[Any], written: Collection[int]) -> float:
    """Triton's `do_bench` median of `fn(*args)`, in us, run on copies of the arguments at `written`."""
    from triton.testing import do_bench

    copies = [clone_like(a) if i in written else a for i, a in enumerate(args)]
    return float(do_bench(lambda: fn(*copies), warmup=WARMUP_MS, rep=TIMED_MS, return_mode="median")) * 1000.0


def clone_like(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and alignment (so it fits the same specialization)."""
    misalign = t.data_ptr() % 16
    offset = misalign // t.element_size() if misalign % t.element_size() == 0 else 0
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    base = torch.empty(span + offset, dtype=t.dtype, device=t.device)
    copy = base.as_strided(t.shape, t.stride(), offset)
    copy.copy_(t)
    return copy
