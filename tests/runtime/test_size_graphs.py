"""CUDA-graph mode for dynamic graphs (`execution.size_graphs`) where no GPU is needed: which sizes pick a
capture, how a capture's graph is made static, the limit, and the report line. On the GPU, test_cuda.py
replays them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from opgen.bench import graph_notes
from opgen.runtime.artifact.compiled import CompiledGraph, InputSpec
from opgen.runtime.execution import size_graphs
from opgen.runtime.execution.cuda_graphs import CaptureRefused, CudaGraphs, GraphOptions, GraphStatus, graph_device
from opgen.runtime.execution.size_graphs import LIMIT, SizeGraphs, SizesStatus, bound_sizes, concrete, symbolic_dims

SPECS = (
    InputSpec("ids", (2, "s0"), ("s0", 1), "int64", "cuda:0"),
    InputSpec("s0", (), (), "int64", "cpu", size=True),
    InputSpec("cache", (2, 4, "s1", 8), ("32*s1", "8*s1", 8, 1), "float32", "cuda:0"),
    InputSpec("mask", ("s0", "s1"), ("s1", 1), "bool", "cuda:0"),
    InputSpec("pos", ("s0 + 1",), (1,), "int64", "cuda:0"),
)
RANGES = (("s0", 1, 64), ("s1", 2, None))
GRAPH = CompiledGraph("key", "forward", "", SPECS, (), (), (), (), written_inputs=(2,), ranges=RANGES)


def _args(s0: int, s1: int) -> list[Any]:
    return [torch.zeros(2, s0, dtype=torch.long), s0, torch.zeros(2, 4, s1, 8), torch.zeros(s0, s1, dtype=torch.bool),
            torch.zeros(s0 + 1, dtype=torch.long)]  # fmt: skip


def test_each_size_text_is_read_once_at_its_first_place() -> None:
    assert symbolic_dims(SPECS) == ((0, 1), (2, 2), (4, 0))


def test_a_capture_sees_a_static_graph_of_the_tensors_alone() -> None:
    args = _args(3, 10)
    static = concrete(GRAPH, args, [0, 2, 3, 4])
    assert [s.name for s in static.inputs] == ["ids", "cache", "mask", "pos"]
    assert static.inputs[1].shape == (2, 4, 10, 8) and static.inputs[1].stride == (320, 80, 8, 1)
    assert static.written_inputs == (1,) and not static.dynamic


def test_size_inputs_are_put_back_in_place() -> None:
    seen: list[tuple[Any, ...]] = []
    call = bound_sizes(lambda *a: seen.append(a), {1: 3, 4: 7})
    call("a", "b", "c")
    assert seen == [("a", 3, "b", "c", 7)]
    plain = lambda *a: a  # noqa: E731
    assert bound_sizes(plain, {}) is plain


class _Recorded:
    """Stands in for a capture's runner: records its calls."""

    def __init__(self, key: tuple[int, ...]) -> None:
        self.key, self.calls = key, []

    def __call__(self, *args: Any) -> Any:
        self.calls.append(args)
        return ("replayed", self.key)


@pytest.fixture
def dispatch(monkeypatch: pytest.MonkeyPatch) -> tuple[SizeGraphs, list[Any]]:
    plain_calls: list[Any] = []
    graphs = SizeGraphs(
        CudaGraphs(GraphOptions(), "M"), lambda *a, **k: plain_calls.append((a, k)) or "plain", GRAPH, {}, None,  # type: ignore[arg-type]
        frozenset({2}),
    )  # fmt: skip
    monkeypatch.setattr(SizeGraphs, "capture", lambda self, key, args: _Recorded(key))
    return graphs, plain_calls


def test_the_second_call_at_a_set_of_sizes_captures_and_later_ones_replay(
    dispatch: tuple[SizeGraphs, list[Any]],
) -> None:
    graphs, plain = dispatch
    assert graphs(*_args(3, 10)) == "plain" and graphs(*_args(5, 10)) == "plain", "first calls run plain"
    assert graphs(*_args(3, 10)) == ("replayed", (3, 3, 10, 4))
    assert graphs(*_args(3, 10)) == ("replayed", (3, 3, 10, 4))
    assert graphs(*_args(5, 10)) == ("replayed", (5, 5, 10, 6))
    assert list(graphs.runners) == [(3, 3, 10, 4), (5, 5, 10, 6)] and len(plain) == 2
    runner = graphs.runners[(3, 3, 10, 4)]
    assert len(runner.calls) == 2 and len(runner.calls[0]) == 4, "the size input is not passed to a capture"
    assert graphs(*_args(3, 10), extra=1) == "plain" and graphs("not", "tensors") == "plain"
    assert graphs.graph_status.first_calls == 2


def test_sizes_that_change_on_every_call_are_never_captured(dispatch: tuple[SizeGraphs, list[Any]]) -> None:
    graphs, _ = dispatch
    for length in range(2, 40):  # a mask one longer each token
        assert graphs(*_args(1, length)) == "plain"
    assert not graphs.runners and graphs.graph_status.first_calls == 38


def test_sizes_past_the_limit_run_plain_and_are_counted(dispatch: tuple[SizeGraphs, list[Any]]) -> None:
    graphs, plain = dispatch
    for s1 in [*range(2, 2 + LIMIT), *range(2, 2 + LIMIT)]:
        graphs(*_args(1, s1))
    graphs(*_args(1, 100))
    assert graphs(*_args(1, 100)) == "plain" and graphs(*_args(1, 2)) == ("replayed", (1, 1, 2, 2))
    assert len(graphs.runners) == LIMIT and graphs.graph_status.past_limit == 1
    assert graphs.graph_status.first_calls == LIMIT + 1 and len(plain) == LIMIT + 2


def test_the_report_line() -> None:
    status = SizesStatus(first_calls=3)
    assert "none captured yet" in status.line() and "3 first calls ran plain" in status.line()
    status.captures[(1,)] = GraphStatus(reason="capture failed: boom")
    assert status.line() == "CUDA graph: not used, running the plain generated code: capture failed: boom"
    assert not status.captured
    status.captures[(2,)] = GraphStatus(captured=True, capture_seconds=0.25, calls=lambda: (7, 0))
    assert status.captured
    status.captures[(3,)] = GraphStatus(captured=True, capture_seconds=0.5, calls=lambda: (3, 1))
    status.past_limit = 2
    line = status.line()
    assert line == (
        f"CUDA graph: dynamic shapes, one graph a set of sizes: 2 captured (0.75 s), at most {LIMIT}, replayed "
        f"since (10 replays; calls that ran plain: 3 first calls at new sizes, 2 at sizes past the {LIMIT} "
        "captured, 1 with inputs unlike a capture's); a capture refused: capture failed: boom"
    )
    assert graph_notes._graph_line(line) == (
        f"2 sizes captured, 10 replays, plain: 3 first calls at new sizes, 2 at sizes past the {LIMIT} captured, "
        "1 with inputs unlike a capture's"
    )


def test_size_inputs_are_not_cpu_tensors_to_the_device_check() -> None:
    assert graph_device(GRAPH, {}) == torch.device("cuda", 0)
    with pytest.raises(CaptureRefused, match="input mask is a CPU tensor"):
        graph_device(replace(GRAPH, inputs=(*SPECS[:3], replace(SPECS[3], device="cpu"))), {})


def test_a_dynamic_graph_on_the_cpu_runs_plain_and_says_why() -> None:
    cpu = replace(GRAPH, inputs=tuple(replace(s, device="cpu") for s in SPECS))
    graphs = CudaGraphs(GraphOptions(), "M")
    with pytest.warns(Warning, match="the graph has no CUDA tensors"):
        fn = size_graphs.wrap(graphs, lambda *a: None, cpu, {})
    assert fn.graph_status.reason.startswith("the graph has no CUDA tensors")  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="takes a static graph"):
        graphs.wrap(lambda *a: None, cpu, {})
