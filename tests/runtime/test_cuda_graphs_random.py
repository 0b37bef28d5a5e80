"""CUDA-graph mode with random ops: attention at dropout_p=0 is no random op, and graphs that do
draw random numbers are captured too, each replay drawing fresh ones (as torch's own graphs do).

Skipped without a GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_cuda_graphs_cpu import record_wraps
from torch import nn

import opgen

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

N = 1 << 20  # elements of the random tensors: the statistics below hold to about 0.001


class Attention(nn.Module):
    """Self-attention as transformers write it: dropout on the attention weights only in training."""

    def __init__(self, width: int = 64, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Uniform(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


class Dropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x) * 2


@pytest.fixture
def no_graph_warning() -> Iterator[None]:
    """Fails the test if opgen warns that it runs a graph plain."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    refused = [str(w.message) for w in seen if "CUDA graphs not used" in str(w.message)]
    assert not refused, refused


def _attention(training: bool) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Attention(dropout=0.5).cuda().train(training)
    return model, torch.randn(2, 16, 64, device="cuda")


@pytest.mark.usefixtures("no_graph_warning")
def test_eval_attention_is_captured() -> None:
    model, x = _attention(training=False)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True, fallback=True)
        for _ in range(3):
            x = torch.randn_like(x)
            torch.testing.assert_close(fn(x), model(x), atol=1e-4, rtol=1e-4)
    assert fn.graph_status.captured, fn.report()
    assert fn.graph_status.random == ()
    assert fn.artifact.random_calls == ()
    assert "CUDA graph: captured" in str(fn.report())
    assert "random ops" not in str(fn.report())


@pytest.mark.usefixtures("no_graph_warning")
def test_eval_attention_is_captured_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """AOT graphs call the fused overloads (`_scaled_dot_product_flash_attention`, ...) instead."""
    graphs = record_wraps(monkeypatch)
    model, x = _attention(training=False)
    torch._dynamo.reset()
    fn = torch.compile(model, backend="opgen", dynamic=False, options={"cuda_graphs": True})
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn_like(x)
            torch.testing.assert_close(fn(x), model(x), atol=1e-4, rtol=1e-4)
    [graph] = graphs
    assert "_attention" in graph.source, graph.source
    assert graph.random_calls == ()


@pytest.mark.usefixtures("no_graph_warning")
def test_training_attention_dropout_is_random_and_captured() -> None:
    model, x = _attention(training=True)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True, fallback=True)
        fn(x)  # the first call captures
        first, second = fn(x), fn(x)
    assert fn.graph_status.captured, fn.report()
    assert "aten.scaled_dot_product_attention.default" in fn.graph_status.random
    assert "draw fresh numbers on every replay" in str(fn.report())
    assert not torch.equal(first, second)


def _compile(model: nn.Module, x: torch.Tensor, graphs: bool = True) -> Callable[..., Any]:
    with torch.no_grad():
        return opgen.compile(model, (x,), cuda_graphs=graphs, fallback=True)  # type: ignore[no-any-return]


@pytest.mark.usefixtures("no_graph_warning")
def test_uniform_numbers_are_fresh_on_every_replay() -> None:
    x = torch.zeros(N, device="cuda")
    fn = _compile(Uniform(), x)
    with torch.no_grad():
        calls = [fn(x) for _ in range(4)]  # capture, then three replays
    assert fn.graph_status.captured, fn.report()
    assert fn.graph_status.random == ("aten.rand_like.default",)
    for i, out in enumerate(calls):
        assert 0 <= out.min().item() and out.max().item() < 1
        assert abs(out.mean().item() - 0.5) < 0.003
        assert abs(out.var().item() - 1 / 12) < 0.001
        for other in calls[:i]:
            assert not torch.equal(out, other)


@pytest.mark.usefixtures("no_graph_warning")
def test_dropout_in_training_is_fresh_and_scaled() -> None:
    p = 0.25
    x = torch.ones(N, device="cuda")
    fn = _compile(Dropout(p).train(), x)
    with torch.no_grad():
        calls = [fn(x) for _ in range(4)]
    assert fn.graph_status.captured, fn.report()
    assert fn.graph_status.random
    for i, out in enumerate(calls):
        kept = out != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 0.003
        torch.testing.assert_close(out[kept], torch.full_like(out[kept], 2 / (1 - p)))
        for other in calls[:i]:
            assert not torch.equal(out, other)


@pytest.mark.usefixtures("no_graph_warning")
def test_manual_seed_makes_replays_reproducible() -> None:
    """After `torch.manual_seed`, graph mode draws exactly what plain calls draw (the first, capturing
    call included: its warm-up's draws are undone), as torch's own graphs do."""
    x = torch.zeros(4096, device="cuda")
    plain, graphed = _compile(Uniform(), x, graphs=False), _compile(Uniform(), x)
    with torch.no_grad():
        torch.manual_seed(7)
        expected = [plain(x) for _ in range(3)]
        for _ in range(2):  # capture and replays, then replays only
            torch.manual_seed(7)
            got = [graphed(x) for _ in range(3)]
            for a, b in zip(got, expected, strict=True):
                assert torch.equal(a, b)
        torch.manual_seed(7)
        graphed(x)
        after_graph = torch.rand(16, device="cuda")  # the replay advanced the generator as a plain call does
        torch.manual_seed(7)
        plain(x)
        after_plain = torch.rand(16, device="cuda")
    assert graphed.graph_status.captured
    assert torch.equal(after_graph, after_plain)


@pytest.mark.usefixtures("no_graph_warning")
def test_random_graph_on_another_stream_and_with_static_outputs() -> None:
    x = torch.zeros(N, device="cuda")
    with torch.no_grad():
        fn = opgen.compile(Uniform(), (x,), cuda_graphs=True, static_outputs=True, fallback=True)
        fn(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            first = fn(x).clone()
            second = fn(x).clone()
        torch.cuda.current_stream().wait_stream(stream)
    assert fn.graph_status.captured
    assert not torch.equal(first, second)
    assert abs(second.mean().item() - 0.5) < 0.003


@pytest.mark.usefixtures("no_graph_warning")
def test_random_specializations_share_the_generator_and_match_plain_calls() -> None:
    """Two captured shapes of one model, replayed in turn, draw what the same plain calls draw."""
    small, large = torch.zeros(1000, device="cuda"), torch.zeros(5000, device="cuda")
    plain, graphed = _compile(Uniform(), small, graphs=False), _compile(Uniform(), small)
    order = [small, large, small, large, large, small]
    with torch.no_grad():
        for fn in (plain, graphed):
            fn(small), fn(large)  # compile (and capture) both shapes
        torch.manual_seed(3)
        expected = [plain(x) for x in order]
        torch.manual_seed(3)
        got = [graphed(x) for x in order]
    assert "specializations for input shapes so far: 2" in str(graphed.report())
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
