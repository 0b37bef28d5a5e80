"""Each step's tokens, copied to the host without waiting for them.

The loop launches step after step; `push` queues a non-blocking copy of the step's tokens into pinned
host memory and records an event. `landed()` hands back, in order, the steps whose copy has finished
(it polls their events, never waits), so the host learns of stop tokens and streams tokens while the
GPU runs ahead. At most `depth` copies are in flight: a push past that waits for the oldest, which
bounds how far the launches run ahead of what the host has seen. On the CPU a copy has landed when
it is made.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch


class Landing:
    def __init__(self, batch: int, device: torch.device, depth: int = 16) -> None:
        self.cuda = device.type == "cuda"
        self.depth = depth
        self._host = torch.empty((depth, batch), dtype=torch.long, pin_memory=self.cuda)
        self._pending: deque[tuple[int, int, torch.cuda.Event | None]] = deque()  # (step, slot, event)
        self._next_slot = 0

    def push(self, step: int, tokens: torch.Tensor) -> Iterator[tuple[int, list[int]]]:
        """Queue step `step`'s tokens [B]; yields the steps that land meanwhile (waiting only when full)."""
        if len(self._pending) == self.depth:
            yield self._take()
        slot = self._next_slot
        self._next_slot = (slot + 1) % self.depth
        self._host[slot].copy_(tokens, non_blocking=self.cuda)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending.append((step, slot, event))

    def landed(self) -> Iterator[tuple[int, list[int]]]:
        """The steps whose copies have finished, oldest first, without waiting."""
        while self._pending and (self._pending[0][2] is None or self._pending[0][2].query()):
            yield self._take()

    def drain(self) -> Iterator[tuple[int, list[int]]]:
        """Every step still in flight, waiting for each."""
        while self._pending:
            yield self._take()

    def _take(self) -> tuple[int, list[int]]:
        step, slot, event = self._pending.popleft()
        if event is not None:
            event.synchronize()
        return step, self._host[slot].tolist()
