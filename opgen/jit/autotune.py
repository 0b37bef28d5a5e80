"""Autotuning: the first call with real arguments times every config and keeps the fastest.

Configs are timed together, in interleaved rounds (`medians_us`), on copies of the arguments the
kernel writes (those it declares, or every tensor when it declares none), so the caller's tensors
are written once, by the real launch after the pick.
The pick is stored in the JIT cache, keyed by the configs' binaries and the argument sizes, so a
second process tunes nothing.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import torch

from opgen.jit import cache, compiler
from opgen.jit.binary import KernelBinary
from opgen.jit.specialize import Specialization


class Tunable(Protocol):
    """What autotuning needs of a kernel (`opgen.jit.kernels.JitKernel`, which calls `pick`)."""

    fn: Any
    name: str
    configs: tuple[Any, ...]
    mutates: tuple[int, ...] | None
    native: Any  # the extension module whose JitLauncher type the kernel's launchers are

    def add_variant(self, binary: KernelBinary, config: Any, args: Sequence[Any], *, into: Any = None) -> None: ...


def size_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a pick depends on besides the binaries: tensor sizes, strides, dtypes and 16-byte alignment (a
    Triton binary specializes on it: a pick timed on a misaligned view is not one for aligned tensors), other
    values."""
    return tuple(
        (tuple(a.shape), tuple(a.stride()), str(a.dtype), a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
        else repr(a) for a in args
    )  # fmt: skip


def pick(
    kernel: Tunable,
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
    calls = [_config_call(kernel, future.result(), config, args) for future, config in pairs]
    timings = medians_us(calls)
    index = min(range(len(timings)), key=timings.__getitem__)
    cache.STATS.add("tunes")
    cache.STATS.add("tune_seconds", time.perf_counter() - start)
    cache.store_pick(key, {"index": index, "timings_us": timings})
    shown = ", ".join(f"{t:.1f}" for t in timings)
    return index, f"autotuned on the first call (us per launch: {shown})"


def _config_call(kernel: Tunable, binary: KernelBinary, config: Any, args: Sequence[Any]) -> Callable[[], Any]:
    """A launch of one config on copies of what the kernel writes, through a launcher of its own."""
    native = kernel.native
    scratch = native.JitLauncher(kernel.name, len(args), None)
    kernel.add_variant(binary, config, args, into=scratch)
    written = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if kernel.mutates is not None:
        written = [i for i in written if i in kernel.mutates]
    return bound(lambda *copies: native.jit_launch_strict(scratch, *copies), args, written)


def bound(fn: Callable[..., Any], args: Sequence[Any], written: Collection[int]) -> Callable[[], Any]:
    """`fn(*args)` as a call of no arguments, on copies of the arguments at `written` (made once)."""
    copies = [clone_like(a) if i in written else a for i, a in enumerate(args)]
    return lambda: fn(*copies)


# Interleaved rounds: each round empties the L2 cache (Triton's benchmark buffer) before every
# candidate, then times it. A slow moment (clocks ramping, a busy host) spoils one round of every
# candidate alike, not one candidate's whole timing. A model's first call times every config of every
# new kernel and both sides of every multi-kernel choice, so the rounds are few: WARMUP_ROUNDS, then
# enough for about TIMED_MS of GPU time per candidate, between MIN_ROUNDS and MAX_ROUNDS (a 5-100 us
# kernel, about 0.1 ms a round with the L2 flush: MAX_ROUNDS).
WARMUP_ROUNDS, TIMED_MS, MIN_ROUNDS, MAX_ROUNDS = 2, 4.0, 5, 30


def medians_us(calls: Sequence[Callable[[], Any]]) -> list[float]:
    """The median time of each call, in us, timed in interleaved rounds (each call runs once first)."""
    from triton import runtime

    driver = runtime.driver.active
    flush = driver.get_empty_cache_for_benchmark()
    for call in calls:  # lazy work (a nested kernel's compile or autotune) happens here, untimed
        call()
    for _ in range(WARMUP_ROUNDS):
        _round(calls, driver, flush)
    first = _round(calls, driver, flush, timed=True)
    torch.cuda.synchronize()
    round_ms = sum(start.elapsed_time(end) for start, end in first) or 1e-3
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(TIMED_MS * len(calls) / round_ms)))
    timed = [first] + [_round(calls, driver, flush, timed=True) for _ in range(rounds - 1)]
    torch.cuda.synchronize()
    return [statistics.median(r[i][0].elapsed_time(r[i][1]) for r in timed) * 1000.0 for i in range(len(calls))]


# Cycles the GPU spins (`torch.cuda._sleep`, about 50 us on an H100/H200) before each timed call, so that it
# is still busy while the host records the start event and launches the call: the interval between the
# events is then the call's GPU time. Without it, a GPU idle after the L2 flush also timed the host's
# launch latency, which is larger for a Triton kernel launched from Python than for an ATen one.
SPIN_CYCLES = 100_000


def _round(calls: Sequence[Callable[[], Any]], driver: Any, flush: Any, timed: bool = False) -> list[Any]:
    events = []
    for call in calls:
        driver.clear_cache(flush)
        if not timed:
            call()
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        call()
        end.record()
        events.append((start, end))
    return events


def clone_like(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and alignment (so it fits the same specialization)."""
    misalign = t.data_ptr() % 16
    offset = misalign // t.element_size() if misalign % t.element_size() == 0 else 0
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    base = torch.empty(span + offset, dtype=t.dtype, device=t.device)
    copy = base.as_strided(t.shape, t.stride(), offset)
    copy.copy_(t)
    return copy
