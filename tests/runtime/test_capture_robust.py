"""Capture never fails on a decomposition: one that raises or leaves a mutating op is skipped (issue 9).

The regression: torch's decomposition of `constant_pad_nd` (MobileNetV2's padding) builds a graph
with `prims.copy_to`, and aot_autograd's "expected an entirely functional graph" assertion used to
escape from opgen.compile as the user's error. Here kernel_ops is made to lack `constant_pad_nd`,
so that capture tries that decomposition; the op must stay in the graph, and strict lowering must
name it and say what to do.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from opgen.runtime.capture import export
from opgen.runtime.capture.decompositions import KEEP_FUSED, decomposition_table, kept_ops
from opgen.runtime.errors import UnsupportedOpError
from opgen.runtime.lowering.lower import LowerOptions, lower


class Pad(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, [1, 1, 1, 1]) * 2


def _without(registry, *atens: str):  # type: ignore[no-untyped-def]
    return dataclasses.replace(registry, by_aten={k: v for k, v in registry.by_aten.items() if k not in atens})


def _ops(graph: torch.fx.Graph) -> set[str]:
    return {str(n.target) for n in graph.nodes if n.op == "call_function"}


def test_failing_decomposition_is_skipped_and_the_op_named(registry) -> None:  # type: ignore[no-untyped-def]
    small = _without(registry, "aten::constant_pad_nd")
    with torch.no_grad():
        ep = export.export_program(Pad(), (torch.randn(1, 2, 4, 4),), small)
    assert "aten.constant_pad_nd.default" in _ops(ep.graph)
    assert export.is_functional(ep.graph)
    signature = export.signature_of(ep)
    with pytest.raises(
        UnsupportedOpError,
        match=r"op aten\.constant_pad_nd\.default has no kernel_ops binding.*ops\.yaml.*fallback=True",
    ):
        lower(ep.graph_module, signature, small, LowerOptions())


def test_decompose_uncovered_skips_a_raising_decomposition(registry) -> None:  # type: ignore[no-untyped-def]
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.constant_pad_nd.default(x, [1, 1]))
    small = _without(registry, "aten::constant_pad_nd")

    def raising(program, table):  # type: ignore[no-untyped-def]
        raise AssertionError("aot_autograd expected to have an entirely functional graph")

    assert export.decompose_uncovered(gm, raising, small) is gm


def test_decompose_uncovered_skips_a_mutating_result(registry) -> None:  # type: ignore[no-untyped-def]
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.constant_pad_nd.default(x, [1, 1]))
    mutating = torch.fx.symbolic_trace(lambda x: torch.ops.aten.add_.Tensor(x, x))
    small = _without(registry, "aten::constant_pad_nd")
    assert not export.is_functional(mutating.graph)
    assert export.decompose_uncovered(gm, lambda program, table: mutating, small) is gm


def test_fused_kernels_stay_out_of_the_table(registry) -> None:  # type: ignore[no-untyped-def]
    table = decomposition_table(registry)
    kept = kept_ops(registry)
    assert torch.ops.aten.scaled_dot_product_attention.default in kept
    assert torch.ops.aten.silu.default in kept
    assert not set(kept) & set(table.keys())
    # an op kernel_ops does not bind is decomposed as before
    small = _without(registry, "aten::silu")
    assert torch.ops.aten.silu.default in decomposition_table(small).keys()
    assert set(kept) <= set(KEEP_FUSED)
