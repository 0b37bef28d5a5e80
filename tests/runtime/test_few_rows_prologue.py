"""Norms as the prologue of the few-row product kernels that read them (`passes.fusion.gemv_prologue` at 2 to
64 rows; source in `codegen.triton.few_rows_prologue` and `codegen.triton.group_blocks`).

As in `test_gemv_prologue.py`: without a GPU the program is relabelled as CUDA around the gemv, fusion and
prologue passes, and each kernel is bound to the ATen calls it replaced, or run in Triton's interpreter
with every config and checked against them. The CPU's own linear passes (oneDNN, MKL, prepacking, which
take products of 8 rows and more on a CPU) are left out, as on CUDA. With a GPU the kernels run for real.
"""

from __future__ import annotations

import ast
import copy

import pytest
import torch
from fusion_interp import CPU_PASSES, InterpretedBinding, compile_with_pass, needs_triton, ran_in_fresh_interpreter
from test_gemv_prologue import TOLERANCE, Layer, PostNorm, cuda, inputs, prologues, run_passes
from torch import nn

import opgen
from opgen.runtime.codegen.triton import few_rows
from opgen.runtime.codegen.triton.dependent_launch import SIGNAL, WAIT
from opgen.runtime.codegen.triton.gemv import dependent_helper
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel
from opgen.runtime.passes.fusion.gemv_prologue import WIDEST_FEW_ROWS

torch.manual_seed(0)
ROWS = 8


def compile_rows(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple,
                 checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    with torch.no_grad():
        leave_out = ("split_bias", "lift_views", *CPU_PASSES)
        return compile_with_pass(monkeypatch, model.eval(), example, "fusion", run_passes, checks,  # type: ignore[no-any-return]
                                 {"atol": 1e-4, "rtol": 1e-4}, leave_out=leave_out)  # fmt: skip


class CenteredNorm(nn.Module):
    """A norm whose second reduction reads the first's result (as a LayerNorm's variance reads its mean)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(-1, keepdim=True)
        return centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-5)


class CenteredLayer(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.norm, self.q = CenteredNorm(), nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.q(self.norm(residual + x))


class PeakNorm(nn.Module):
    """Two reductions of one pass (a mean of squares and a maximum), neither reading the other."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.q = nn.Linear(d, 48, bias=True)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = (residual + x).float()
        scale = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) + 0.1 * h.abs().amax(-1, keepdim=True)
        return self.q((h * scale).to(x.dtype))


@pytest.mark.parametrize("bias", [False, True])
def test_each_rms_norm_is_the_first_step_of_the_few_row_products_that_read_it(monkeypatch: pytest.MonkeyPatch,
                                                                              bias: bool) -> None:  # fmt: skip
    model, example = Layer(bias=bias), inputs(rows=ROWS)
    compiled, specs = compile_rows(monkeypatch, model, example)
    merged = prologues(specs)
    assert len(merged) == 2, [s.describe for s in specs]
    qkv, mlp = sorted(merged, key=lambda s: "silu" in s.describe)
    assert "few-row kernel, 3 product(s) of 8 rows of 64" in qkv.describe and "silu(gate) * up" in mlp.describe
    assert "row kernel, 8 rows of 64" in qkv.describe
    assert len(qkv.outputs) == 4 and len(mlp.outputs) == 2  # each residual sum too: the next add reads it
    assert not any(s.describe.startswith("row kernel") for s in specs)
    for spec in merged:
        ast.parse(spec.source)
        assert "def _sums(" in spec.source and "def _block(" in spec.source and "if STORE:" in spec.source
        blocks = {dict(meta)["BLOCK_N"] for meta, *_ in spec.configs}
        assert len(spec.configs) > 1 and blocks <= {tile[0] for tile in few_rows.TILES}  # the few-row kernel's tiles
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


@pytest.mark.parametrize(("model", "merges"), [(Layer(norm="layer"), 0), (CenteredLayer(), 0), (PeakNorm(), 1)],
                         ids=["layer_norm", "two_levels", "two_of_one_level"])  # fmt: skip
def test_only_reductions_of_one_pass_over_the_row_are_taken(monkeypatch: pytest.MonkeyPatch, model: nn.Module,
                                                           merges: int) -> None:  # fmt: skip
    """A LayerNorm (one step: its variance reads its mean) and a norm that centres its row first keep their
    row kernels at a few rows (`blockwise`); two reductions that read only the row merge."""
    example = inputs(rows=ROWS)
    compiled, specs = compile_rows(monkeypatch, model, example)
    assert len(prologues(specs)) == merges, [s.describe for s in specs]
    assert sum(s.describe.startswith("row kernel") for s in specs) >= 1 - merges
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]
    _, specs = compile_rows(monkeypatch, model, inputs(rows=1))
    assert len(prologues(specs)) >= 1  # at one row the whole row is in registers: any row group merges


def test_a_post_norm_row_is_stored_by_the_few_row_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    model, example = PostNorm(), inputs(rows=ROWS)
    compiled, specs = compile_rows(monkeypatch, model, example)
    (merged,) = prologues(specs)
    assert "silu(gate) * up" in merged.describe and len(merged.outputs) == 2
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_the_kernel_reads_its_weights_then_sums_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_rows(monkeypatch, Layer(), inputs(rows=ROWS))
    for spec in prologues(specs):
        helper = spec.source.split("def _gated(" if "silu" in spec.describe else "def _tiles(")[1]
        first_load = helper.index("tl.load(w")
        assert first_load < helper.index("= _sums(") < helper.index("= _loads(") < helper.index("xs = _block(")
        assert helper.index("xs = _block(") < helper.index("tl.dot(")
        loop = helper.split("for start in range(BLOCK_K, K, BLOCK_K):")[1]
        # each block of K computed from reads made one block ahead, then the next block's read
        assert (
            loop.index("xs = _block(l0, l1, l2, out0, s0, start, store, BLOCK_M, BLOCK_K)")
            < loop.index("l0, l1, l2 = _loads(in0, in1, in2, start + BLOCK_K, BLOCK_M, BLOCK_K)")
            < loop.index("tl.dot(")
        )
        source = dependent_helper(helper.replace(SIGNAL, "").replace(WAIT, ""), False)
        assert WAIT not in source
    rows = few_rows.Rows("in0", "", "    s0 = _sums(in0, BLOCK_M, BLOCK_K)\n", "xs = _block(in0, s0, {start})")
    for helper in (few_rows.tiles_helper(rows), few_rows.gated_helper_of(rows)):
        source = dependent_helper(helper, True)
        assert source.index(SIGNAL) < source.index("tl.load(w") < source.index(WAIT) < source.index("_sums(")


def test_the_widest_tile_is_the_few_row_kernels():
    assert max(block_n for block_n, *_ in few_rows.TILES) == WIDEST_FEW_ROWS


@needs_triton
@pytest.mark.parametrize("model", [Layer(d=80, kv=40, hidden=70, bias=True), PostNorm(d=80, hidden=70),
                                   PeakNorm(d=80)], ids=["layer", "post_norm", "two_sums"])  # fmt: skip
@pytest.mark.parametrize("rows", [2, ROWS, 12])
def test_the_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                              model: nn.Module, rows: int) -> None:  # fmt: skip
    """Rows and a length that no block fits (80 columns, blocks of 16 rows and up)."""
    if ran_in_fresh_interpreter(request):
        return
    checks: list[str] = []
    compiled, specs = compile_rows(monkeypatch, model, inputs(80, rows=rows), checks=checks)
    example = inputs(80, rows=rows)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    merged = prologues(specs)
    assert merged and {s.name for s in merged} <= set(checks)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("force", ["triton", None])
def test_on_the_gpu_plain_and_in_graph_mode(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                            force: str | None) -> None:  # fmt: skip
    if force is not None:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    model = Layer(d=256, kv=128, hidden=704).to(device="cuda", dtype=dtype).eval()
    eager = copy.deepcopy(model)
    tol = TOLERANCE[dtype]
    for graphs in (False, True):
        with torch.no_grad():
            example = inputs(256, rows=ROWS, dtype=dtype, device="cuda")
            compiled = opgen.compile(model, example, cuda_graphs=graphs, cache=False)
            assert str(compiled.report()).count("its row computed first") == 2, compiled.report()
            for _ in range(3):
                example = inputs(256, rows=ROWS, dtype=dtype, device="cuda")
                torch.testing.assert_close(compiled(*example).clone(), eager(*example), atol=tol, rtol=tol)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_config_on_the_gpu(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    checks: list[str] = []
    tolerance = {"atol": TOLERANCE[dtype], "rtol": TOLERANCE[dtype]}
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    model = Layer(d=2048, kv=1024, hidden=1024).to(device="cuda", dtype=dtype).eval()
    example = inputs(2048, rows=ROWS, dtype=dtype, device="cuda")
    with torch.no_grad():
        compiled = opgen.compile(model, example, cache=False)
        torch.testing.assert_close(compiled(*example), model(*example), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert str(compiled.report()).count("its row computed first") == 2
