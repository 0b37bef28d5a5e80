"""CUDA-graph mode where no GPU is needed: options, the CPU fallback, and how outputs are planned."""

from __future__ import annotations

import pytest
import torch

import opgen
from opgen.bench import models
from opgen.runtime.execution.cuda_graphs import CaptureRefused, output_plans


def test_graph_mode_on_a_cpu_model_runs_plain_and_says_why() -> None:
    x, y = torch.randn(16), torch.randn(16)
    with torch.no_grad():
        with pytest.warns(
            opgen.OpgenWarning, match=r"CUDA graphs not used for SingleAdd: the graph has no CUDA tensors"
        ):
            fn = opgen.compile(models.SingleAdd(), (x, y), cuda_graphs=True, cache=False)
        torch.testing.assert_close(fn(x, y), x + y)
    assert not fn.graph_status.captured
    assert "CUDA graph: not used, running the plain generated code: the graph has no CUDA tensors" in str(fn.report())


def test_static_outputs_needs_graph_mode() -> None:
    with pytest.raises(ValueError, match="static_outputs=True needs cuda_graphs=True"):
        opgen.compile(models.SingleAdd(), (torch.randn(2), torch.randn(2)), static_outputs=True)


def test_backend_lists_the_graph_options() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(models.SingleAdd(), backend="opgen", options={"cuda_graph": True})
    with pytest.raises(Exception, match=r"unknown options \['cuda_graph'\].*cuda_graphs, static_outputs"):
        compiled(torch.randn(2), torch.randn(2))


def test_output_plans() -> None:
    """Inputs' views are rebuilt on the caller's tensor, pool outputs copied, views of them re-viewed."""
    static = torch.zeros(3, 4)
    pooled = torch.zeros(2, 6)
    other = torch.zeros(5)
    constant = torch.ones(2)
    ranges = [(pooled.untyped_storage().data_ptr(), pooled.untyped_storage().data_ptr() + 48),
              (other.untyped_storage().data_ptr(), other.untyped_storage().data_ptr() + 20)]  # fmt: skip
    leaves = [static.t(), pooled, pooled[1], other, constant, None]
    plans = output_plans(leaves, [static], frozenset(), ranges, static_outputs=False)
    assert plans[0] == ("input_view", 0, (4, 3), (1, 4), 0)
    assert plans[1] == ("fresh", pooled)
    assert plans[2] == ("fresh_view", 1, (6,), (1,), 6)
    assert plans[3] == ("fresh", other)
    assert plans[4] == ("object", constant) and plans[5] == ("object", None)
    static_plans = output_plans(leaves, [static], frozenset(), ranges, static_outputs=True)
    assert [p[0] for p in static_plans] == ["input_view", "object", "object", "object", "object", "object"]
    fixed = output_plans([static.t()], [static], frozenset({0}), ranges, static_outputs=False)
    assert [p[0] for p in fixed] == ["object"]  # a view of a parameter: it stays where it is


def test_output_plans_refuse_what_copies_cannot_reproduce() -> None:
    pooled = torch.zeros(4, 4)
    start = pooled.untyped_storage().data_ptr()
    overlapping = [pooled[:, :2], pooled[:, 1:]]  # neither is dense, neither covers the other
    with pytest.raises(CaptureRefused, match="share memory"):
        output_plans(overlapping, [], frozenset(), [(start, start + 64)], static_outputs=False)
    static = torch.zeros(4)
    with pytest.raises(CaptureRefused, match="another dtype"):
        output_plans([static.view(torch.int32)], [static], frozenset(), [], static_outputs=False)
