"""Interleaved timing, as ../shared/BENCH.md asks: one process, A B A B ..., median of repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class Timing:
    """Microseconds per call over the repeats: median, min, max."""

    median_us: float
    min_us: float
    max_us: float

    def ratio_to(self, base: Timing) -> float:
        return self.median_us / base.median_us


def calls_for(fn: Callable[[], object], target_s: float = 0.01) -> int:
    """Pick a call count so that one repeat lasts about `target_s`."""
    fn()
    start = time.perf_counter()
    count = 0
    while time.perf_counter() - start < target_s / 4:
        fn()
        count += 1
    return max(1, count * 4)


def interleaved(
    candidates: Sequence[Callable[[], object]],
    repeats: int = 7,
    warmup: int = 3,
    target_s: float = 0.01,
    sync: Callable[[], None] | None = None,
    enqueue: bool = False,
) -> list[Timing]:
    """Time each candidate in round-robin repeats; every repeat runs `n` calls of one candidate.

    `sync` (e.g. torch.cuda.synchronize) runs after each repeat's calls, inside the timed region
    ("sync" time: calls plus waiting for the device). With `enqueue`, each call is timed alone and
    followed by `sync` outside the timed region: the host time of a call, the device idle at its start.
    """
    if enqueue:
        assert sync is not None, "enqueue timing needs the device's sync"
        return _enqueue(candidates, repeats, warmup, target_s, sync)
    for fn in candidates:
        for _ in range(warmup):
            fn()
    counts = [calls_for(fn, target_s) for fn in candidates]
    samples: list[list[float]] = [[] for _ in candidates]
    for _ in range(repeats):
        for i, fn in enumerate(candidates):
            n = counts[i]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            if sync is not None:
                sync()
            samples[i].append((time.perf_counter() - start) / n * 1e6)
    return [Timing(statistics.median(s), min(s), max(s)) for s in samples]


def _enqueue(
    candidates: Sequence[Callable[[], object]],
    repeats: int,
    warmup: int,
    target_s: float,
    sync: Callable[[], None],
) -> list[Timing]:
    for fn in candidates:
        for _ in range(warmup):
            fn()
    sync()
    counts = [max(1, calls_for(fn, target_s) // 2) for fn in candidates]
    samples: list[list[float]] = [[] for _ in candidates]
    clock = time.perf_counter
    for _ in range(repeats):
        for i, fn in enumerate(candidates):
            total = 0.0
            for _ in range(counts[i]):
                sync()
                start = clock()
                fn()
                total += clock() - start
            sync()
            samples[i].append(total / counts[i] * 1e6)
    return [Timing(statistics.median(s), min(s), max(s)) for s in samples]


def device_sync(device: torch.device) -> Callable[[], None]:
    """Waits for `device`'s work: `torch.cuda.synchronize` on CUDA, nothing on the CPU (its calls return done)."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def back_to_back(steps: Sequence[Callable[..., Any]], inputs: Sequence[tuple[torch.Tensor, ...]], repeats: int,
                 device: torch.device, before: Callable[[], Any] | None = None) -> list[float]:  # fmt: skip
    """Per candidate, the median over `repeats` of a step's time in ms with one step per input enqueued back
    to back and one synchronization at the end, as a loop that feeds each token back on the device runs;
    candidates interleaved. `before` runs before each candidate's repeat (a barrier: ranks in lockstep)."""
    sync = device_sync(device)
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for i, step in enumerate(steps):
            if before is not None:
                before()
            sync()
            start = time.perf_counter()
            for args in inputs:
                step(*args)
            sync()
            samples[i].append((time.perf_counter() - start) / len(inputs) * 1e3)
    return [statistics.median(s) for s in samples]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain Markdown table, so results paste into a note as they are."""
    cells = [[str(h) for h in headers]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def target_line(what: str, value: float, limit: float) -> str:
    """One line of an issue's definition of done, as measured: `  what: 0.830 (target <= 1.000): met`."""
    return f"  {what}: {value:.3f} (target <= {limit:.3f}): {'met' if value <= limit else 'NOT met'}"


def max_error(out: Any, ref: Any) -> float:
    """The largest absolute difference between two outputs (pytrees of tensors)."""
    from torch.utils import _pytree  # timing itself needs no torch

    outs, refs = _pytree.tree_leaves(out), _pytree.tree_leaves(ref)
    return max((float((o - r).abs().max()) for o, r in zip(outs, refs, strict=True) if o.numel()), default=0.0)


WARMUP_SECONDS = 0.25  # copies before the timed ones: an idle GPU takes a while to reach its clocks


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second `y.copy_(x)` moves (read + write), median of 5 repeats: 1 GiB on CUDA, 64 MiB on CPU,
    after WARMUP_SECONDS of copies; on CUDA timed by events, so a busy host (other processes compiling)
    does not show as a slow copy. Timed by the host with one copy before, it read 2.7 and 3.6 TB/s on
    H200s that gave 4.2 in other processes of the same runs."""
    cuda = device.type == "cuda"
    size = 2**30 if cuda else 2**26
    x = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    y = torch.empty_like(x)
    sync = device_sync(device)
    calls = 10 if cuda else 5
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_SECONDS:
        y.copy_(x)
        sync()
    samples = []
    for _ in range(5):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(calls):
                y.copy_(x)
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3 / calls)
        else:
            began = time.perf_counter()
            for _ in range(calls):
                y.copy_(x)
            samples.append((time.perf_counter() - began) / calls)
    del x, y
    return 2 * size / statistics.median(samples)
