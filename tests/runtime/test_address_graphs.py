"""CUDA-graph mode for graphs that write their inputs (`execution.address_graphs`): copied at new addresses, in
place where addresses come back. The dispatch and the report line run anywhere; on a GPU, a cache passed to
torch.compile (marked static or not) is copied, then written in place when it comes back, and no capture keeps
one alive."""

from __future__ import annotations

import gc
import re
import weakref
from typing import Any

import pytest
import torch
from torch import nn

from opgen.bench import graph_notes
from opgen.runtime.execution.address_graphs import LIMIT, STAY, AddressGraphs
from opgen.runtime.execution.cuda_graphs import GraphStatus


class _Recorded:
    """Stands in for a capture's runner: its status, and the calls it got."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, 0
        self.graph_status = GraphStatus(captured=True, capture_seconds=0.5, calls=lambda: (self.calls, 0))

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.name


def _dispatch() -> tuple[AddressGraphs, list[Any]]:
    made: list[_Recorded] = []
    plain: list[Any] = []

    def make(kind: str) -> _Recorded:
        made.append(_Recorded(f"{kind} {len(made)}"))
        return made[-1]

    graphs = AddressGraphs(lambda: make("in place"), lambda: make("copying"),
                           lambda *a, **k: plain.append(a) or "plain", (1, 2))  # fmt: skip
    return graphs, plain


def test_new_addresses_are_copied_and_ones_that_come_back_get_a_capture_in_place() -> None:
    graphs, plain = _dispatch()
    x = torch.zeros(2)
    a, b, c = ((torch.zeros(3), torch.zeros(3)) for _ in range(3))
    assert [graphs(x, *a) for _ in range(3)] == ["copying 0"] * 3, "one generate()'s cache: copied"
    assert graphs(x, *b) == "copying 0" and graphs(x, *c) == "copying 0", "a new cache each call: copied"
    assert [graphs(x, *b) for _ in range(2)] == ["in place 1"] * 2, "a cache back at the same addresses"
    assert graphs(x, *a) == "in place 2" and graphs(x, *b) == "in place 1"
    assert graphs(x, a[0], b[1]) == "copying 0", "each input's address is in the key"
    assert graphs("not", "tensors") == "plain" and plain == [("not", "tensors")]


def test_addresses_that_stay_get_a_capture_in_place() -> None:
    """A cache the caller keeps and passes again: copied until its copies cost about a capture."""
    graphs, _ = _dispatch()
    x, a, b = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    assert {graphs(x, a, b) for _ in range(STAY - 1)} == {"copying 0"}
    assert graphs(x, a, b) == "in place 1" and graphs(x, a, b) == "in place 1"


def test_in_place_captures_past_the_limit_drop_the_oldest() -> None:
    graphs, _ = _dispatch()
    x = torch.zeros(1)
    caches = [(torch.zeros(1), torch.zeros(1)) for _ in range(LIMIT + 1)]
    for cache in caches + caches:  # each comes back once
        graphs(x, *cache)
    assert len(graphs.runners) == LIMIT and graphs.dropped == 1
    assert graphs(x, *caches[0]) == "copying 0", "the dropped one is copied, as a new set is"
    assert graphs(x, *caches[1]) == "in place 2" and graphs(x, *caches[0]) == f"in place {LIMIT + 2}"
    assert graphs.dropped == 2


def test_the_report_line() -> None:
    graphs, _ = _dispatch()
    x, a, b = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    assert graphs.graph_status.line().startswith("CUDA graph: not captured yet")
    for key in [(a, b), (a, b), (b, a), (a, b), (a, b)]:
        graphs(x, *key)
    line = graphs.graph_status.line()
    assert line == (
        "CUDA graph: captured (2 graphs, 1.00 s), replayed since (5 replays); its 2 written inputs: copied in and "
        f"out at new addresses, used in place at 1 set of addresses that came back or stayed {STAY} calls"
    ), line
    assert graphs.graph_status.captured and graphs.graph_status.calls() == (5, 0)
    assert graph_notes._graph_line(line) == (
        "5 replays, 0 plain (2 graphs: written inputs in place at 1 sets of addresses)"
    )


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Step(nn.Module):
    """A decode step's shape: writes the cache in place at a position, reads all of it."""

    def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, x)
        return torch.tanh(cache).sum(0) * 2


def _cache(marked: bool) -> torch.Tensor:
    cache = torch.zeros(16, 64, device="cuda")
    if marked:  # as transformers' StaticCache made outside a compiled region
        torch._dynamo.mark_static_address(cache)
    return cache


@CUDA
@pytest.mark.parametrize("marked", [True, False], ids=["marked static", "unmarked"])
def test_a_cache_is_copied_then_used_in_place_when_it_comes_back_and_never_kept_alive(marked: bool) -> None:
    torch._dynamo.reset()
    step = _Step()
    compiled = torch.compile(step, backend="opgen", options={"cuda_graphs": True})
    caches = {"first": _cache(marked), "second": _cache(marked)}
    references = {name: torch.zeros(16, 64, device="cuda") for name in caches}
    position = dict.fromkeys(caches, 0)

    def call(name: str, times: int) -> None:
        for _ in range(times):
            x = torch.randn(1, 64, device="cuda")
            pos = torch.tensor([position[name]], device="cuda")
            position[name] += 1
            torch.testing.assert_close(compiled(x, caches[name], pos), step(x, references[name], pos))
            for other in caches:
                torch.testing.assert_close(caches[other], references[other])

    with torch.no_grad(), graph_notes.collecting() as made:
        call("first", 4)
        (fn,) = made
        assert re.search(r"\(3 replays\); its 1 written inputs: copied in and out at new addresses, used in place "
                         r"at 0 sets", fn.report().cuda_graph)  # fmt: skip
        call("second", 3)
        call("first", 3)  # back at the addresses it had: captured in place (its first call ran plain)
        assert re.search(r"captured \(2 graphs, .*\(8 replays\).* in place at 1 set of", fn.report().cuda_graph)
        freed = [weakref.ref(t) for t in caches.values()]
        caches.clear()
        gc.collect()
        assert all(ref() is None for ref in freed), "no capture keeps a cache alive"
    torch._dynamo.reset()
