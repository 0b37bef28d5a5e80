"""GPU time of a few calls that compute the same thing, each timed alone, for a pick among them.

Interleaved rounds: each round empties the L2 cache (Triton's benchmark buffer) before every call,
then times it between two CUDA events. A slow moment (clocks ramping) spoils one round of every call
alike, not one call's whole timing; each call's time is its median over the rounds.

The events time the GPU only while the GPU never waits for the host between them. Before each timed
call the GPU spins (`torch.cuda._sleep`) while the host records the start event and launches the
call, so the interval between the events is the call's GPU time. The spin must outlast that host
work, which varies: about 20 us for a Triton launch from Python, 100 us for some ATen sequences, and
200-500 us for the same calls made inside the first call of a `torch.compile` backend on an H200
(where a fixed 50 us spin timed a 9 us matrix-vector kernel at 110 us and sent 64 of a 1B Llama's 65
products to cuBLAS). So the untimed warm-up rounds measure the host's time per call, the spin is set
to twice the slowest, and a timed sample counts only if the host finished launching before the spin
did. A call with too few such samples is timed again with a longer spin; where the host still does
not keep up, the result says so (`Timings.trusted`) and callers keep the pick out of the disk cache.

A model's first call times every config of every new kernel and both sides of every multi-kernel
choice, so the rounds are few: WARMUP_ROUNDS, then enough for about TIMED_MS of GPU time per call,
between MIN_ROUNDS and MAX_ROUNDS (a 5-100 us kernel, about 0.1 ms a round with the L2 flush:
MAX_ROUNDS).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

WARMUP_ROUNDS, TIMED_MS, MIN_ROUNDS, MAX_ROUNDS = 2, 4.0, 5, 30
MIN_SPIN_US, MAX_SPIN_US = 50.0, 5000.0


@dataclass(frozen=True, slots=True)
class Timings:
    us: list[float]  # per call: its median GPU time over the rounds whose host kept up, in us
    trusted: bool  # every call had at least MIN_ROUNDS such rounds

    @property
    def caveat(self) -> str:
        """What a pick's reason adds when the host could not keep the GPU waiting (the pick is not cached)."""
        return "" if self.trusted else "; the host was too slow for a clean timing, so it is not cached"


@dataclass(frozen=True, slots=True)
class _Sample:
    start: torch.cuda.Event
    end: torch.cuda.Event
    host_us: float  # from the spin's launch to the end event's record, on the host

    def gpu_us(self) -> float:
        return self.start.elapsed_time(self.end) * 1000.0


def time_calls(calls: Sequence[Callable[[], Any]]) -> Timings:
    """The GPU time of each call, in us, in interleaved rounds (each call runs once first, untimed)."""
    from triton import runtime

    driver = runtime.driver.active
    flush = driver.get_empty_cache_for_benchmark()
    for call in calls:  # lazy work (a nested kernel's compile or autotune) happens here, untimed
        call()
    spin_us = MIN_SPIN_US
    warm = [_round(calls, driver, flush, spin_us) for _ in range(WARMUP_ROUNDS)]
    spin_us = _spin_for(warm)
    first = _round(calls, driver, flush, spin_us)
    torch.cuda.synchronize()
    round_ms = sum(s.gpu_us() for s in first) / 1000.0 or 1e-3
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(TIMED_MS * len(calls) / round_ms)))
    timed = [first] + [_round(calls, driver, flush, spin_us) for _ in range(rounds - 1)]
    if any(len(_kept(timed, i, spin_us)) < MIN_ROUNDS for i in range(len(calls))):  # the host slowed down
        spin_us = _spin_for(timed)
        timed = [_round(calls, driver, flush, spin_us) for _ in range(rounds)]
    torch.cuda.synchronize()
    us, trusted = [], True
    for i in range(len(calls)):
        kept = _kept(timed, i, spin_us)
        trusted &= len(kept) >= MIN_ROUNDS
        us.append(statistics.median(s.gpu_us() for s in (kept or [r[i] for r in timed])))
    return Timings(us, trusted)


def _kept(rounds: Sequence[Sequence[_Sample]], i: int, spin_us: float) -> list[_Sample]:
    """Call i's samples in which the host launched everything while the GPU still spun."""
    return [r[i] for r in rounds if r[i].host_us < spin_us]


def _spin_for(rounds: Sequence[Sequence[_Sample]]) -> float:
    slowest = max(s.host_us for r in rounds for s in r)
    return min(MAX_SPIN_US, max(MIN_SPIN_US, 2.0 * slowest))


def _round(calls: Sequence[Callable[[], Any]], driver: Any, flush: Any, spin_us: float) -> list[_Sample]:
    samples = []
    cycles = int(spin_us * _cycles_per_us())
    for call in calls:
        driver.clear_cache(flush)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begun = time.perf_counter()
        torch.cuda._sleep(cycles)
        start.record()
        call()
        end.record()
        samples.append(_Sample(start, end, (time.perf_counter() - begun) * 1e6))
    return samples


@functools.cache
def _cycles_per_us() -> float:
    """How many `torch.cuda._sleep` cycles the current GPU spins per us (its clock), measured once."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(200_000)  # the GPU is busy while the host records the events around the measured spin
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    return 1_000_000 / max(start.elapsed_time(end) * 1000.0, 1.0)
