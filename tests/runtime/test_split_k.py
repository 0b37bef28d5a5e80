"""Few-row products split into pieces of K (`passes.fusion.split_k`, `codegen.triton.split_k`): how many
pieces a plan may take, the configs, the buffers setup makes, and every config in Triton's interpreter
against the ATen calls, launched one after another on the same buffers (a config that left a counter
unfit for the next launch fails the next one)."""

from __future__ import annotations

import pytest
import torch
from fusion_interp import needs_triton, ran_in_fresh_interpreter
from test_gemv import Block, compile_gemv

from opgen.runtime.codegen.triton import few_rows
from opgen.runtime.ir import GemvPlan, GemvRows
from opgen.runtime.passes.fusion.split_k import MAX_SPLIT, PIECE_UNIT, split_k


def plan(n: int, k: int, rows: int = 8, gated: bool = False) -> GemvPlan:
    products = (GemvRows(n, k, False),) * (2 if gated else 1)
    return GemvPlan(k, 1, products, gated=gated, m=rows, x_row_stride=k)


@pytest.mark.parametrize(
    ("n", "k", "rows", "gated", "pieces"),
    [
        (3072, 2048, 8, False, 2),  # Llama-3.2-1B's q/k/v: 192 blocks of 16, 3 wanted, 16 units: 2
        (2048, 2048, 8, False, 4),  # its output projection: 128 blocks, 4 pieces of 512
        (2048, 8192, 8, False, 4),  # its down projection: 4 pieces of 2048
        (896, 896, 8, False, 7),  # Qwen2.5-0.5B's output projection: 7 pieces of 128 (no power of two)
        (8192, 2048, 8, False, 1),  # 512 blocks already
        (2048, 8192, 1, False, 1),  # one row: the matrix-vector kernel, 1024 programs of 2 rows
        (2048, 8192, 8, True, 1),  # a gated pair is never split
        (2048, 1000, 8, False, 1),  # K no whole number of PIECE_UNIT
    ],
)
def test_pieces_of_k(n: int, k: int, rows: int, gated: bool, pieces: int) -> None:
    assert split_k(plan(n, k, rows, gated)) == pieces


def test_the_pieces_are_bounded() -> None:
    for n in (16, 64, 1000, 4096):
        for k in (128, 384, 4096, 3 * 5 * 7 * 128):
            pieces = split_k(plan(n, k))
            assert 1 <= pieces <= MAX_SPLIT and k % (pieces * PIECE_UNIT) == 0


def test_every_tile_whole_and_in_pieces() -> None:
    """Llama-3.2-1B's down projection at 8 rows: each tile once whole, once in 4 pieces of 2048 (a grid axis)."""
    down = plan(2048, 8192)
    down = GemvPlan(down.k, 1, down.products, m=8, x_row_stride=8192, split_k=split_k(down))
    configs = few_rows.configs(down)
    assert len(configs) == 2 * len(few_rows.TILES)
    for meta, _, _, grid in configs:
        got = dict(meta)
        blocks = -(-2048 // got["BLOCK_N"])
        if got["SPLIT"] == 1:
            assert grid == (blocks,)
        else:
            assert got["SPLIT"] == 4 and grid == (blocks, 4) and 2048 % got["BLOCK_K"] == 0
    assert down.partial_elements == 4 * 8 * 2048 and down.counters == 128  # a counter per block of 16


def test_setup_makes_the_buffers_and_the_kernels_write_them(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Block(d=256, kv=128, hidden=384)  # q/k/v 512 x 256 (2 pieces), o 256 x 256 (2), down 256 x 384 (3)
    x = torch.randn(8, 256)
    compiled, specs = compile_gemv(monkeypatch, model, (x,))
    split = [s for s in specs if s.writes]
    assert sorted(s.describe.split(": ")[1] for s in split) == ["256 + 128 + 128 rows", "256 rows", "256 rows"]
    for spec in split:  # not the gated pair
        part, count = spec.writes
        assert part.name.startswith("gemv_split") and part.name.endswith("_part") and part.meta.dtype == "float32"
        assert count.name.endswith("_count") and count.meta.dtype == "int32"
        assert spec.inputs[-2:] == (part.name, count.name) and "_finish(acc, bias, out, part, count" in spec.source
        assert any(dict(meta)["SPLIT"] > 1 for meta, *_ in spec.configs)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]


@needs_triton
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [3, 8])
def test_every_config_matches_in_the_interpreter(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, bias: bool, rows: int
) -> None:
    """Every config of every kernel, the split ones on the same buffers one after another, twice."""
    if ran_in_fresh_interpreter(request):
        return
    model = Block(d=256, kv=128, hidden=384, bias=bias)
    checks: list[str] = []
    compiled, specs = compile_gemv(monkeypatch, model, (torch.randn(rows, 256),), checks=checks)
    assert sum(1 for s in specs if s.writes) == (4 if bias else 3)  # with biases gate and up are two products
    for _ in range(2):
        x = torch.randn(rows, 256)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert sorted(checks) == sorted([s.name for s in specs] * 2)


def _gpu_jit() -> bool:
    if not torch.cuda.is_available():
        return False
    from opgen.jit.env import available

    return bool(available())


@pytest.mark.skipif(not _gpu_jit(), reason="needs a CUDA GPU, a CUDA build of opgen and triton")
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_only_split_configs_on_the_gpu(monkeypatch: pytest.MonkeyPatch, graphs: bool, bias: bool) -> None:
    """A down projection's shape (8 rows, K 2048, 256 columns) with only its split configs, plain and replayed
    in a CUDA graph call after call: the counters come back to zero on the device, every launch."""
    import opgen

    whole = few_rows.configs
    monkeypatch.setattr(few_rows, "configs", lambda p: tuple(c for c in whole(p) if dict(c[0]).get("SPLIT", 1) > 1))
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    down = torch.nn.Linear(2048, 256, bias=bias).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)
        compiled = opgen.compile(down, (x,), cuda_graphs=graphs, cache=False)
        for _ in range(4):
            x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x).clone(), down(x), atol=2e-2, rtol=2e-2)
    report = str(compiled.report())
    assert "few-row kernel" in report and ("replayed" in report) == graphs, report
