"""The matrix-vector pass on a GPU: one-row and few-row products (siblings together) match eager with the Triton
kernel forced, with cuBLAS forced, and as the first call picks; in CUDA-graph mode too. Skipped
without a GPU and opgen's JIT.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_gemv import Block
from test_split_products import FusedGateUp
from test_weight_layout import MLP as Conv1DMLP

import opgen


def _jit_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    from opgen.jit.env import available

    return bool(available())


pytestmark = pytest.mark.skipif(not _jit_ready(), reason="needs a CUDA GPU, a CUDA build of opgen and triton")

TOLERANCE = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},  # cuBLAS may use TF32-free split-K: summation order differs
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


@pytest.mark.parametrize("force", ["triton", "aten", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_products_match_eager(
    monkeypatch: pytest.MonkeyPatch, force: str | None, dtype: torch.dtype, bias: bool, rows: int
) -> None:
    if force is not None:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    model = Block(d=256, kv=128, hidden=704, bias=bias).to(device="cuda", dtype=dtype).eval()
    eager = copy.deepcopy(model)
    with torch.no_grad():
        x = torch.randn(rows, 1, 256, device="cuda", dtype=dtype)
        compiled = opgen.compile(model, (x,))
        for _ in range(3):
            x = torch.randn(rows, 1, 256, device="cuda", dtype=dtype)
            torch.testing.assert_close(compiled(x), eager(x), **TOLERANCE[dtype])
    report = str(compiled.report())
    assert report.count("matrix-vector kernel" if rows == 1 else "few-row kernel") == 4, report
    assert ("silu(gate) * up" in report) != bias, report  # the gated pair's kernel where there is no bias


# Products other passes make gemv's: Phi-3's fused gate/up weight, split (`split_products`), then gated; GPT-2's
# `Conv1D` weights ([K, N]), copied once into a linear layer's layout (`transpose_weights`). (model, report lines)
REWRITTEN = {
    "fused_gate_up": (lambda: FusedGateUp(d=256, hidden=704), ("silu(gate) * up",)),
    "row_major": (lambda: Conv1DMLP(d=256, hidden=704), ("[K, N]",)),
}


@pytest.mark.parametrize("force", ["triton", "aten"])
@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("case", list(REWRITTEN))
def test_products_other_passes_rewrite_take_the_kernels(monkeypatch: pytest.MonkeyPatch, force: str, rows: int,
                                                        case: str) -> None:  # fmt: skip
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    make, lines = REWRITTEN[case]
    model = make().to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        compiled = opgen.compile(model, (torch.randn(rows, 1, 256, device="cuda", dtype=torch.bfloat16),))
        for _ in range(3):
            x = torch.randn(rows, 1, 256, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[torch.bfloat16])
    report = str(compiled.report())
    kind = "matrix-vector kernel" if rows == 1 else "few-row kernel"
    assert all(line in report for line in (*lines, kind)), report


@pytest.mark.parametrize("rows", [1, 8])
def test_graph_mode_replays_the_kernels(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    model = Block(d=128, kv=64, hidden=384).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        x = torch.randn(rows, 128, device="cuda", dtype=torch.bfloat16)
        compiled = opgen.compile(model, (x,), cuda_graphs=True)
        for _ in range(3):
            x = torch.randn(rows, 128, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x).clone(), model(x), **TOLERANCE[torch.bfloat16])
    assert "replayed" in str(compiled.report())


@pytest.mark.parametrize("rows", [1, 8])
def test_a_large_product_spans_many_programs(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """An lm_head-like product: 32000 rows of 512, one or eight rows in."""
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    head = torch.nn.Linear(512, 32000, bias=False).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
        compiled = opgen.compile(head, (x,))
        torch.testing.assert_close(compiled(x), head(x), **TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tile_on_the_gpu(monkeypatch: pytest.MonkeyPatch, rows: int, dtype: torch.dtype) -> None:
    """Each tile of each kernel launched on the GPU against the cuBLAS calls it replaces (the first call's
    timing runs only the fastest)."""
    from fusion_interp import InterpretedBinding

    from opgen.runtime.execution import fused as fused_module

    checks: list[str] = []
    tolerance = TOLERANCE[dtype]
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    model = Block(d=256, kv=128, hidden=704).to(device="cuda", dtype=dtype).eval()
    x = torch.randn(rows, 256, device="cuda", dtype=dtype)
    with torch.no_grad():
        compiled = opgen.compile(model, (x,), cache=False)
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[dtype])
    assert len([c for c in checks if c.startswith("gemv_" if rows == 1 else "gemm_rows_")]) == 4
