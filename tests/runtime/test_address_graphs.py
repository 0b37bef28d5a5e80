"""CUDA-graph mode for graphs that write their inputs (`execution.address_graphs`): one capture repointed at
wherever they live; where that is refused, copied at new addresses and in place where addresses come back.
The dispatch and the report line run anywhere; on a GPU, a cache passed to torch.compile (marked static or
not) is written where it lives whatever its address, or (repointing off) copied, then written in place when
it comes back, and no capture keeps one alive."""

from __future__ import annotations

import gc
import re
import weakref
from typing import Any

import pytest
import torch
from torch import nn

from opgen.bench import graph_notes
from opgen.runtime.execution import address_graphs
from opgen.runtime.execution.address_graphs import LIMIT, STAY, AddressGraphs
from opgen.runtime.execution.cuda_graphs import GraphStatus


class _Recorded:
    """Stands in for a capture's runner: its status, and the calls it got. One asked to repoint says on its
    first call whether it could (`repoints`: True, or why not)."""

    def __init__(self, name: str, repoints: bool | str | None = None) -> None:
        self.name, self.calls, self.repoints, self.moved = name, 0, repoints, 0
        self.graph_status = GraphStatus(captured=True, capture_seconds=0.5, calls=lambda: (self.calls, 0),
                                        repoints=lambda: self.moved)  # fmt: skip

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.repoints is not None:
            self.graph_status.repointed = self.repoints is True
            self.graph_status.not_repointed = None if self.repoints is True else self.repoints
            self.graph_status.repointed_kernels = 32
        return self.name


def _dispatch(repoints: bool | str | None = None) -> tuple[AddressGraphs, list[Any]]:
    """An AddressGraphs over recorded runners; with `repoints` None, repointing is off (the rule alone)."""
    made: list[_Recorded] = []
    plain: list[Any] = []

    def make(kind: str, repoint: bool = False) -> _Recorded:
        made.append(_Recorded(f"{kind} {len(made)}", repoints if repoint else None))
        return made[-1]

    switch = address_graphs.REPOINT
    address_graphs.REPOINT = repoints is not None
    try:
        graphs = AddressGraphs(lambda repoint: make("in place", repoint), lambda: make("copying"),
                               lambda *a, **k: plain.append(a) or "plain", (1, 2))  # fmt: skip
    finally:
        address_graphs.REPOINT = switch
    return graphs, plain


def test_a_capture_that_repoints_serves_every_address() -> None:
    graphs, plain = _dispatch(repoints=True)
    x = torch.zeros(2)
    caches = [(torch.zeros(3), torch.zeros(3)) for _ in range(3)]
    assert {graphs(x, *cache) for cache in caches + caches} == {"in place 0"}, "one capture, no copies"
    assert graphs("not", "tensors") == "in place 0", "its runner checks the inputs (and runs plain where unlike)"
    assert graphs.runners == {} and graphs.copying is None and not plain
    line = graphs.graph_status.line()
    assert line == (
        "CUDA graph: captured on the first call (0.50 s), replayed since (7 replays); its 2 written inputs: used in "
        "place wherever they live, the graph repointed at new addresses 0 times (32 kernels take them)"
    ), line
    assert graph_notes._graph_line(line) == "7 replays, 0 plain (written inputs repointed 0 times)"


def test_a_capture_that_cannot_repoint_keeps_its_addresses_and_the_rule_serves_the_rest() -> None:
    graphs, _ = _dispatch(repoints="a copy node reads or writes a written input")
    x = torch.zeros(2)
    a, b = (torch.zeros(3), torch.zeros(3)), (torch.zeros(3), torch.zeros(3))
    assert graphs(x, *a) == "in place 0", "the capture tried: in place at its first call's addresses"
    assert graphs(x, *b) == "copying 1" and graphs(x, *b) == "copying 1", "new addresses: copied"
    assert graphs(x, *a) == "in place 0" and graphs(x, *b) == "in place 2", "b came back after another set"
    line = graphs.graph_status.line()
    assert "used in place at 2 sets" in line and line.endswith("; not repointed: a copy node reads or writes a "
                                                               "written input"), line  # fmt: skip
    assert graph_notes._graph_line(line).endswith(
        "(3 graphs: written inputs in place at 2 sets of addresses), not repointed: a copy node reads or writes a "
        "written input"
    )


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
    """A decode step's shape: writes the cache in place at a position, reads all of it (pointwise, reduced, and
    in a matrix product)."""

    def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache.index_copy_(0, pos, x)
        return torch.tanh(cache).sum(0) * 2, x @ cache.t()


def _cache(marked: bool) -> torch.Tensor:
    cache = torch.zeros(16, 64, device="cuda")
    if marked:  # as transformers' StaticCache made outside a compiled region
        torch._dynamo.mark_static_address(cache)
    return cache


@CUDA
@pytest.mark.parametrize("repoint", [True, False], ids=["repointed", "copied"])
@pytest.mark.parametrize("marked", [True, False], ids=["marked static", "unmarked"])
def test_a_cache_is_written_where_it_lives_and_never_kept_alive(
    marked: bool, repoint: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repointed: one capture follows each cache. Copied (repointing off): copied, then in place when it comes
    back. Either way every cache holds what eager's does, and no capture keeps one alive."""
    monkeypatch.setattr(address_graphs, "REPOINT", repoint)
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
        line = fn.report().cuda_graph
        if repoint:
            assert re.search(
                r"\(3 replays\); its 1 written inputs: used in place wherever they live, the graph "
                r"repointed at new addresses 0 times \([1-9]\d* kernels take them\)",
                line,
            ), line
        else:
            assert re.search(r"\(3 replays\); its 1 written inputs: copied in and out at new addresses, used in "
                             r"place at 0 sets", line), line  # fmt: skip
        call("second", 3)
        call("first", 3)  # back at the addresses it had
        line = fn.report().cuda_graph
        if repoint:
            assert re.search(r"on the first call .*\(9 replays\).* repointed at new addresses 2 times", line), line
        else:  # captured in place (its first call ran plain)
            assert re.search(r"captured \(2 graphs, .*\(8 replays\).* in place at 1 set of", line), line
        freed = [weakref.ref(t) for t in caches.values()]
        caches.clear()
        gc.collect()
        assert all(ref() is None for ref in freed), "no capture keeps a cache alive"
        call_new = _cache(marked)  # a cache where a freed one was, or anywhere: still right
        ref = torch.zeros(16, 64, device="cuda")
        x, pos = torch.randn(1, 64, device="cuda"), torch.tensor([3], device="cuda")
        torch.testing.assert_close(compiled(x, call_new, pos), step(x, ref, pos))
        torch.testing.assert_close(call_new, ref)
    torch._dynamo.reset()


class _TwoCaches(nn.Module):
    """Keys and values written at a position, read together."""

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        k.index_copy_(0, pos, x)
        v.index_copy_(0, pos, 2 * x)
        return (k * v).sum(0)


@CUDA
def test_caches_that_are_views_of_one_buffer_hold_what_eager_writes() -> None:
    """Keys and values as two halves of one allocation, a new allocation each time: every call's halves hold
    what eager's do. For inputs that alias, the graph AOT autograd hands the backend writes them through a
    copy node (so an H200 showed), which refuses repointing: the copy-or-come-back rule serves it."""
    torch._dynamo.reset()
    step = _TwoCaches()
    compiled = torch.compile(step, backend="opgen", options={"cuda_graphs": True})
    with torch.no_grad(), graph_notes.collecting() as made:
        for round_ in range(4):
            arena, reference = torch.zeros(2, 16, 64, device="cuda"), torch.zeros(2, 16, 64, device="cuda")
            for position in range(3):
                x = torch.randn(1, 64, device="cuda")
                pos = torch.tensor([position + round_], device="cuda")
                got = compiled(x, arena[0], arena[1], pos)
                torch.testing.assert_close(got, step(x, reference[0], reference[1], pos))
                torch.testing.assert_close(arena, reference)
        line = made[-1].report().cuda_graph
        assert "; not repointed: a copy node reads or writes a written input" in line, line
    torch._dynamo.reset()


class _Overwrite(nn.Module):
    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        cache.copy_(x)  # ATen's copy: a copy node of the graph writes the input
        return cache.sum(0)


@CUDA
def test_a_graph_whose_copy_node_writes_an_input_is_not_repointed_and_stays_right() -> None:
    """The runner cannot follow an address a copy node holds: it says so, and the copy-or-come-back rule serves."""
    from opgen.runtime.pipeline import default_pipeline

    torch._dynamo.reset()
    passes = tuple(p for p in default_pipeline() if p != "cache_writes")  # the copy stays ATen's
    compiled = torch.compile(_Overwrite(), backend="opgen", options={"cuda_graphs": True, "passes": passes})
    caches = [torch.zeros(16, 64, device="cuda") for _ in range(2)]
    with torch.no_grad(), graph_notes.collecting() as made:
        for cache in caches + caches:
            x = torch.randn(16, 64, device="cuda")
            torch.testing.assert_close(compiled(x, cache), x.sum(0))
            torch.testing.assert_close(cache, x)
        line = made[-1].report().cuda_graph
        assert "; not repointed: a copy node reads or writes a written input" in line, line
    torch._dynamo.reset()
