"""The matrix-vector pass on a GPU: one-row products (siblings together) match eager with the Triton
kernel forced, with cuBLAS forced, and as the first call picks; in CUDA-graph mode too. Skipped
without a GPU and opgen's JIT.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_gemv import Block

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
def test_products_match_eager(
    monkeypatch: pytest.MonkeyPatch, force: str | None, dtype: torch.dtype, bias: bool
) -> None:
    if force is not None:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    model = Block(d=256, kv=128, hidden=704, bias=bias).to(device="cuda", dtype=dtype).eval()
    eager = copy.deepcopy(model)
    with torch.no_grad():
        x = torch.randn(1, 1, 256, device="cuda", dtype=dtype)
        compiled = opgen.compile(model, (x,))
        for _ in range(3):
            x = torch.randn(1, 1, 256, device="cuda", dtype=dtype)
            torch.testing.assert_close(compiled(x), eager(x), **TOLERANCE[dtype])
    report = str(compiled.report())
    assert report.count("matrix-vector kernel") == 4, report
    assert ("silu(gate) * up" in report) != bias, report  # the gated pair's kernel where there is no bias


def test_graph_mode_replays_the_kernels() -> None:
    model = Block(d=128, kv=64, hidden=384).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        x = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
        compiled = opgen.compile(model, (x,), cuda_graphs=True)
        for _ in range(3):
            x = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x).clone(), model(x), **TOLERANCE[torch.bfloat16])
    assert "replayed" in str(compiled.report())


def test_a_large_product_spans_many_programs() -> None:
    """An lm_head-like product: 32000 rows of 512, one row in."""
    head = torch.nn.Linear(512, 32000, bias=False).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
        compiled = opgen.compile(head, (x,))
        torch.testing.assert_close(compiled(x), head(x), **TOLERANCE[torch.bfloat16])
