"""CUDA-graph mode for a graph that writes inputs marked static: a capture for each set of their addresses.

torch.compile passes some inputs at an address it says will not change (AOT's static inputs): parameters,
and buffers marked with `torch._dynamo.mark_static_address`. transformers marks its `StaticCache`'s tensors
so, writes them in place in the decode step, and makes a new cache for every `generate()` call. A capture
that copied such inputs into buffers of its own and back would pay two device copies an input a call (64
for a 16-layer model's cache, 0.1-0.2 ms of a 1-2 ms token on an H200) and hold a second cache; one that
used them in place, as it does parameters, would serve one cache only. So they are used in place and the
captures of a static graph (or of one set of sizes of a dynamic graph) are keyed on their addresses, as
Inductor's cudagraph trees record again when a static input's address changes. No capture holds a
reference to them (`cuda_graphs.Capture` keeps none to inputs it uses in place): when a `generate()` ends
its cache is freed, and the next one's, allocated alike, lands at the same addresses and replays the same
capture. A call at new addresses gets a new capture (its first call runs plain and captures). At most
`LIMIT` sets of addresses keep their captures; past it the oldest is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

LIMIT = 4  # sets of addresses whose captures are kept (the oldest dropped past it)

Key = tuple[int, ...]


class AddressesStatus:
    """How the captures run (`GraphStatus`'s fields and line): the latest set of addresses' capture, and how
    many sets came."""

    def __init__(self, graphs: AddressGraphs) -> None:
        self.graphs = graphs

    @property
    def latest(self) -> Any:
        """The `GraphStatus` of the latest set of addresses' capture."""
        return self.graphs.latest.graph_status

    @property
    def captured(self) -> bool:
        return bool(self.latest.captured)

    @property
    def reason(self) -> str | None:
        return self.latest.reason  # type: ignore[no-any-return]

    @property
    def capture_seconds(self) -> float:
        return float(self.latest.capture_seconds)

    @property
    def random(self) -> tuple[str, ...]:
        return tuple(self.latest.random)

    @property
    def calls(self) -> Callable[[], tuple[int, int]] | None:
        return self.latest.calls  # type: ignore[no-any-return]

    def line(self) -> str:
        count, made, dropped = len(self.graphs.rebound), self.graphs.made, self.graphs.dropped
        line = f"{self.latest.line()}; its {count} written static inputs are used in place"
        if made > 1:
            line += (f", a capture a set of their addresses: {made} sets so far"
                     + (f" ({dropped} dropped past {LIMIT})" if dropped else "")
                     + "; the counts are the latest set's")  # fmt: skip
        return line


class AddressGraphs:
    """The function handed out: the capture made for the addresses the call passes the `rebound` inputs at.

    `make()` gives a new capture's runner (a `cuda_graphs.Capture`'s, which captures on its first call).
    """

    def __init__(self, make: Callable[[], Any], plain: Callable[..., Any], rebound: Sequence[int]) -> None:
        self.make, self.plain, self.rebound = make, plain, tuple(rebound)
        self.runners: dict[Key, Any] = {}
        self.latest = make()  # the first call's addresses take it
        self.made = self.dropped = 0
        self.lock = threading.Lock()
        self.graph_status = AddressesStatus(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            key = tuple([args[i].data_ptr() for i in self.rebound])
        except (AttributeError, IndexError, TypeError):  # not the inputs it was compiled for: its errors
            return self.plain(*args, **kwargs)
        runner = self.runners.get(key)
        if runner is None:
            runner = self.new_addresses(key)
        return runner(*args, **kwargs)

    def new_addresses(self, key: Key) -> Any:
        """The runner for addresses not seen yet (under a lock: threads calling at once make one)."""
        with self.lock:
            if (runner := self.runners.get(key)) is not None:
                return runner
            if len(self.runners) >= LIMIT:
                del self.runners[next(iter(self.runners))]  # the oldest: its graph and buffers go
                self.dropped += 1
            runner = self.latest if not self.made else self.make()
            self.runners[key] = self.latest = runner
            self.made += 1
            return runner
