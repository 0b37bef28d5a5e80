"""CUDA-graph mode for written inputs marked static (`execution.address_graphs`): a capture for each set of
their addresses. The dispatch and the report line run anywhere; on a GPU, torch.compile's static-address
buffers (transformers' StaticCache) are written in place, a new one captures again, and no capture keeps
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
from opgen.runtime.execution.address_graphs import LIMIT, AddressGraphs
from opgen.runtime.execution.cuda_graphs import GraphStatus


class _Recorded:
    """Stands in for a capture's runner: its status, and the calls it got."""

    def __init__(self, number: int) -> None:
        self.number, self.calls = number, 0
        self.graph_status = GraphStatus(captured=True, capture_seconds=0.5, calls=lambda: (self.calls, 0))

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return ("replayed", self.number)


def _dispatch() -> tuple[AddressGraphs, list[Any]]:
    made: list[_Recorded] = []
    plain: list[Any] = []

    def make() -> _Recorded:
        made.append(_Recorded(len(made)))
        return made[-1]

    return AddressGraphs(make, lambda *a, **k: plain.append(a) or "plain", (1, 2)), plain


def test_one_capture_a_set_of_addresses_the_oldest_dropped_past_the_limit() -> None:
    graphs, plain = _dispatch()
    x = torch.zeros(2)
    caches = [(torch.zeros(3), torch.zeros(3)) for _ in range(LIMIT + 1)]
    assert graphs(x, *caches[0]) == ("replayed", 0) and graphs(x, *caches[0]) == ("replayed", 0)
    assert graphs(x, caches[0][0], caches[1][1]) == ("replayed", 1), "each input's address is in the key"
    for i, cache in enumerate(caches[1:], start=2):
        assert graphs(x, *cache) == ("replayed", i)
    assert len(graphs.runners) == LIMIT and graphs.dropped == 2 and graphs.made == LIMIT + 2
    assert graphs(x, *caches[0]) == ("replayed", LIMIT + 2), "a dropped set captures again"
    assert graphs("not", "tensors") == "plain" and plain == [("not", "tensors")]


def test_the_report_line() -> None:
    graphs, _ = _dispatch()
    x, a, b = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    assert "not captured yet" not in graphs.graph_status.line()  # the recorded stand-in says captured
    graphs(x, a, b)
    graphs(x, a, b)
    line = graphs.graph_status.line()
    assert line.endswith("(2 replays); its 2 written static inputs are used in place"), line
    graphs(x, b, a)
    line = graphs.graph_status.line()
    assert "(1 replays); its 2 written static inputs are used in place, a capture a set of their addresses: " \
           "2 sets so far; the counts are the latest set's" in line, line  # fmt: skip
    assert graphs.graph_status.captured and graphs.graph_status.calls is not None
    assert graph_notes._graph_line(line) == "1 replays, 0 plain"


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Step(nn.Module):
    """A decode step's shape: writes the cache in place at a position, reads all of it."""

    def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, x)
        return torch.tanh(cache).sum(0) * 2


def _cache() -> torch.Tensor:
    cache = torch.zeros(16, 64, device="cuda")
    torch._dynamo.mark_static_address(cache)
    return cache


@CUDA
def test_a_written_static_input_is_used_in_place_and_a_new_one_captures_again() -> None:
    torch._dynamo.reset()
    step = _Step()
    compiled = torch.compile(step, backend="opgen", options={"cuda_graphs": True})
    first, reference = _cache(), torch.zeros(16, 64, device="cuda")
    with torch.no_grad(), graph_notes.collecting() as made:
        for i in range(4):
            x = torch.randn(1, 64, device="cuda")
            pos = torch.tensor([i], device="cuda")
            torch.testing.assert_close(compiled(x, first, pos), step(x, reference, pos))
            torch.testing.assert_close(first, reference)
        (fn,) = made
        assert re.search(r"\(3 replays\); its 1 written static inputs are used in place$", fn.report().cuda_graph)
        second, kept = _cache(), first.clone()
        for i in range(3):
            x = torch.randn(1, 64, device="cuda")
            pos = torch.tensor([i], device="cuda")
            expected = step(x, torch.zeros(16, 64, device="cuda").index_copy_(0, torch.arange(i, device="cuda"),
                                                                               second[:i]), pos)  # fmt: skip
            torch.testing.assert_close(compiled(x, second, pos), expected)
        torch.testing.assert_close(first, kept, msg="the first cache is not touched by the second's calls")
        assert "2 sets so far" in fn.report().cuda_graph and "(2 replays)" in fn.report().cuda_graph
        freed = weakref.ref(first)
        del first
        gc.collect()
        assert freed() is None, "no capture keeps a cache alive"
    torch._dynamo.reset()
