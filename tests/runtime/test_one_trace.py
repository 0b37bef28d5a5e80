"""Export and decomposition in one trace (`opgen.runtime.capture.one_trace`).

The one trace must give the graph torch.export plus `run_decompositions` give (the same ops, the same
inputs and outputs), and where this torch cannot take that path (its private hook missing or the
trace raising) capture must take the public two-trace path, leaving torch as it was.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.export import _trace

from opgen.runtime.capture import export, one_trace
from opgen.runtime.capture.decompositions import decomposition_table


class Block(torch.nn.Module):
    """Enough of a transformer layer to need the table: layer norm, linear layers, SiLU, attention."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).view(x.shape[0], x.shape[1], 3, 4, 8).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(1, 2).reshape(x.shape)
        return x + self.down(torch.nn.functional.silu(self.up(x)).softmax(-1))


def _ops(ep: torch.export.ExportedProgram) -> Counter[str]:
    calls = (str(n.target) for n in ep.graph.nodes if n.op == "call_function")
    return Counter(op for op in calls if op != "aten._assert_tensor_metadata.default")  # a check, no value


def test_one_trace_gives_the_graph_of_export_then_decomposition(registry) -> None:  # type: ignore[no-untyped-def]
    model, x = Block().eval(), torch.randn(2, 6, 32)
    table = decomposition_table(registry)
    with torch.no_grad():
        one = one_trace.export_decomposed(model, (x,), table, None)
        two = torch.export.export(model, (x,)).run_decompositions(decomposition_table(registry))
        assert one is not None
        assert _ops(one) == _ops(two)
        assert "aten.scaled_dot_product_attention.default" in _ops(one)  # kept whole (KEEP_FUSED)
        assert [s.kind for s in one.graph_signature.input_specs] == [s.kind for s in two.graph_signature.input_specs]
        assert [s.target for s in one.graph_signature.input_specs] == [
            s.target for s in two.graph_signature.input_specs
        ]
        torch.testing.assert_close(one.module()(x), model(x))


def test_capture_takes_one_trace(registry, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the two-trace path ran")

    monkeypatch.setattr(torch.export, "export", refused)
    model, x = Block().eval(), torch.randn(2, 6, 32)
    with torch.no_grad():
        ep = export.export_program(model, (x,), registry)
        torch.testing.assert_close(ep.module()(x), model(x))


def test_dynamic_shapes_reach_the_one_trace(registry) -> None:  # type: ignore[no-untyped-def]
    model, x = Block().eval(), torch.randn(2, 6, 32)
    seq = torch.export.Dim("seq", min=2, max=64)
    with torch.no_grad():
        ep = one_trace.export_decomposed(model, (x,), decomposition_table(registry), ({1: seq},))
        assert ep is not None and ep.range_constraints
        longer = torch.randn(2, 9, 32)
        torch.testing.assert_close(ep.module()(longer), model(longer))


def test_a_torch_without_the_hook_gets_none(registry, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    def older(mod, fake_args, fake_kwargs, fake_params_buffers, constant_attrs):  # type: ignore[no-untyped-def]
        raise AssertionError("not called: it takes no decomposition table")

    monkeypatch.setattr(_trace, "_export_to_aten_ir", older)
    assert one_trace.export_decomposed(Block(), (torch.randn(2, 6, 32),), decomposition_table(registry), None) is None


def test_capture_without_one_trace_takes_two(registry, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(export, "export_decomposed", lambda *args: None)
    model, x = Block().eval(), torch.randn(2, 6, 32)
    with torch.no_grad():
        ep = export.export_program(model, (x,), registry)  # torch.export, then run_decompositions
        torch.testing.assert_close(ep.module()(x), model(x))
    assert "aten.scaled_dot_product_attention.default" in _ops(ep)


def test_a_failing_trace_leaves_torch_as_it_was(registry, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    original = _trace._export_to_aten_ir
    seen = []

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(_trace._export_to_aten_ir is not original)  # the wrapper is in place while it runs
        raise RuntimeError("torch's trace failed")

    monkeypatch.setattr(_trace, "_export", failing)
    assert one_trace.export_decomposed(Block(), (torch.randn(2, 6, 32),), decomposition_table(registry), None) is None
    assert seen == [True] and _trace._export_to_aten_ir is original
