"""CUDA-graph mode for a graph that writes its inputs: repointed to wherever they live, else copied at new
addresses and used in place where addresses recur.

A decode step under torch.compile writes its cache in place, and the cache is an input: transformers'
`StaticCache`, which every `generate()` call makes anew (its tensors marked with
`torch._dynamo.mark_static_address` where the prefill ran eagerly, so AOT lists them among the inputs
that keep their address). Two ways to capture such a graph:
- copying: the graph has buffers of its own for the written inputs, and each replay copies them in and
  back out. One capture serves every cache, at two device copies an input a call (64 for a 16-layer
  model's cache, about 0.1-0.2 ms of a 1-2 ms token on an H200) and a second cache's memory;
- in place, as parameters are: no copy, but the capture serves tensors at its addresses only, and another
  set of addresses needs a capture of its own (tens of milliseconds; Inductor's cudagraph trees record
  again when a static input's address changes).
Which pays depends on whether a new cache lands where the last one was. It does where the allocator hands
the freed blocks back alike, and does not where other allocations interleave (through transformers'
`compile_config` the prefill runs eagerly, and each cache lands elsewhere): there a capture per
`generate()` would cost more than its copies. So a set of addresses is first served by the copying
capture (made once), and gets an in-place capture of its own when it comes back after another set was
used (the second `generate()` at the same addresses), or after `STAY` calls at it (a cache the caller
keeps and passes again: ski rental, the copies paid by then cost about what a capture does). No capture
holds a reference to a tensor it uses in place (`cuda_graphs.Capture`): a freed cache's memory is
handed out again, and a new tensor there replays. At most `LIMIT` sets keep their in-place captures;
past it the oldest is dropped.

On an H200 (Llama-3.2-1B's shape, bf16, 128 new tokens), each `generate()`'s cache landed at new
addresses through both of transformers' compile paths, so their decode steps replayed the copying
capture.

So the first call tries a third way first (`REPOINT`): one capture that uses the written inputs in place,
whose runner points the graph at each call's tensors, wherever they live. At capture the runner finds the
kernel arguments that hold the inputs' addresses (`csrc/opgen/graphs/repoint.h`); when a call passes them
elsewhere it rewrites those arguments (only the kernels that take them, once per move) and replays: no copy
and no second capture, whatever the addresses. It holds where every address of a written input reaches
the graph as a kernel argument (ATen's, cuBLAS's and Triton's kernels take them so); a graph where a copy or
memset node touches one, or a node the runner cannot read, is refused, and the rule above serves it (the
report says why).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

REPOINT = True  # try one capture repointed at each call's written inputs first
LIMIT = 4  # sets of addresses with in-place captures (the oldest dropped past it)
# Calls at one set of addresses before it gets its own capture: a capture took 0.04-0.07 s and a 16-layer
# cache's copies 0.1-0.2 ms a call on an H200, so 256 calls' copies cost about one capture.
STAY = 256
SEEN = 4096  # sets of addresses remembered (forgotten all at once past this)

Key = tuple[int, ...]


class AddressesStatus:
    """How the captures run, with `GraphStatus`'s fields: their replays summed, and the line for `report()`."""

    def __init__(self, graphs: AddressGraphs) -> None:
        self.graphs = graphs

    def statuses(self) -> list[Any]:
        """The `GraphStatus` of each capture alive: the repointed or copying one, then the in-place ones."""
        graphs = self.graphs
        runners = [r for r in (graphs.anywhere, graphs.copying) if r is not None]
        return [r.graph_status for r in [*runners, *graphs.runners.values()]]

    @property
    def captured(self) -> bool:
        return any(s.captured for s in self.statuses())

    @property
    def reason(self) -> str | None:
        return next((s.reason for s in self.statuses() if s.reason is not None), None)

    @property
    def capture_seconds(self) -> float:
        return sum(s.capture_seconds for s in self.statuses() if s.captured)

    @property
    def random(self) -> tuple[str, ...]:
        return tuple(self.graphs.random)

    def calls(self) -> tuple[int, int]:
        """(replays, calls that ran plain after a capture), over the captures alive."""
        counts = [s.calls() for s in self.statuses() if s.captured and s.calls is not None]
        return sum(r for r, _ in counts), sum(p for _, p in counts)

    def line(self) -> str:
        if self.graphs.anywhere is not None:
            return self.repointed_line(self.graphs.anywhere)
        statuses = self.statuses()
        if not any(s.captured for s in statuses):
            return str(statuses[-1].line()) if statuses else "CUDA graph: not captured yet (the first call captures)"
        replays, plain = self.calls()
        count = sum(s.captured for s in statuses)
        line = f"CUDA graph: captured ({count} graphs, {self.capture_seconds:.2f} s), replayed since ({replays} replays"
        if plain:
            line += f"; {plain} calls ran plain: inputs unlike the capture's (sizes, strides)"
        in_place, dropped = len(self.graphs.runners), self.graphs.dropped
        line += (f"); its {len(self.graphs.rebound)} written inputs: copied in and out at new addresses, used in "
                 f"place at {in_place} set{'s' if in_place != 1 else ''} of addresses that came back or stayed "
                 f"{STAY} calls" + (f" ({dropped} dropped past {LIMIT})" if dropped else ""))  # fmt: skip
        if self.graphs.not_repointed is not None:
            line += f"; not repointed: {self.graphs.not_repointed}"
        if self.reason is not None:
            line += f"; a capture refused: {self.reason}"
        if self.random:
            line += f"; random ops ({', '.join(self.random)}) draw fresh numbers on every replay"
        return line

    def repointed_line(self, runner: Any) -> str:
        status = runner.graph_status
        return str(status.line(
            f"its {len(self.graphs.rebound)} written inputs: used in place wherever they live, the graph "
            f"repointed at new addresses {status.repoints()} times ({status.repointed_kernels} kernels take them)"
        ))  # fmt: skip


class AddressGraphs:
    """The function handed out: the capture repointed at every call's `rebound` inputs where the first call's
    capture could be; else the in-place capture for the addresses the call passes them at, else the copying
    capture.

    `in_place(repoint)` and `copying()` make a capture's runner (a `cuda_graphs.Capture`'s, which captures on
    its first call), the one using the `rebound` inputs in place (and, with `repoint`, following them to new
    addresses: its status's `repointed` says whether it could), the other copying them.
    """

    def __init__(
        self, in_place: Callable[[], Any], copying: Callable[[], Any], plain: Callable[..., Any],
        rebound: Sequence[int], random: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.make_in_place, self.make_copying, self.plain = in_place, copying, plain
        self.rebound, self.random = tuple(rebound), tuple(random)
        self.runners: dict[Key, Any] = {}  # in-place captures, by addresses
        self.copying: Any = None  # made by the first call
        self.counts: dict[Key, int] = {}  # calls at each set of addresses the copying capture served
        self.last: Key | None = None  # the latest call's addresses
        self.dropped = 0
        self.trial: Any = None if REPOINT else False  # the repointing capture until its first call decides
        self.anywhere: Any = None  # that capture, where it repoints: it serves every call
        self.not_repointed: str | None = None  # why it could not
        self.lock = threading.Lock()
        self.graph_status = AddressesStatus(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.anywhere is not None:
            return self.anywhere(*args, **kwargs)
        try:
            key = tuple([args[i].data_ptr() for i in self.rebound])
        except (AttributeError, IndexError, TypeError):  # not the inputs it was compiled for: its errors
            return self.plain(*args, **kwargs)
        runner = self.runners.get(key)
        if runner is None:
            runner = self.arrive(key)
        else:
            self.last = key
        result = runner(*args, **kwargs)
        if runner is self.trial:
            self.decide(runner.graph_status)
        return result

    def decide(self, status: Any) -> None:
        """After the repointing capture's first call: it serves every call where it repoints; else it stays the
        in-place capture of its addresses."""
        if status.repointed is not None:
            self.trial = False
            if status.repointed:
                self.anywhere = self.runners.pop(self.last)
            else:
                self.not_repointed = status.not_repointed
        elif status.reason is not None:  # not captured at all: the rule decides as for any capture
            self.trial = False

    def arrive(self, key: Key) -> Any:
        """The runner for addresses without an in-place capture: the copying one, or a new in-place capture
        where they come back after others or stay `STAY` calls (under a lock: threads calling at once make one)."""
        with self.lock:
            if (runner := self.runners.get(key)) is not None:
                return runner
            if self.trial is None:
                self.last = key
                runner = self.trial = self.runners[key] = self.make_in_place(True)
                return runner
            came_back = key != self.last and key in self.counts
            if len(self.counts) >= SEEN:
                self.counts.clear()
            self.counts[key] = calls = self.counts.get(key, 0) + 1
            self.last = key
            if came_back or calls >= STAY:
                del self.counts[key]
                if len(self.runners) >= LIMIT:
                    del self.runners[next(iter(self.runners))]  # the oldest: its graph goes
                    self.dropped += 1
                runner = self.runners[key] = self.make_in_place(False)
                return runner
            if self.copying is None:
                self.copying = self.make_copying()
            return self.copying
