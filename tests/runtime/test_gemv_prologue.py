"""Norms as the prologue of the matrix-vector kernels that read them (`passes.fusion.gemv_prologue`).

Without a GPU the program is relabelled as CUDA around the gemv, fusion and prologue passes (as for the
other kernel passes); each kernel is bound to the ATen calls it replaced, or, where triton is installed,
run in Triton's interpreter with every config and checked against them. With a GPU the kernels run for
real: forced, picked, in CUDA-graph mode, and every config launched.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from fusion_interp import InterpretedBinding, compile_with_pass, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.passes.fusion.gemv import fuse_gemv
from opgen.runtime.passes.fusion.gemv_prologue import MAX_K, fuse_gemv_prologue
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.registry import KernelRegistry

torch.manual_seed(0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm: in float32, the weight applied in the input's dtype."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Layer(nn.Module):
    """A decoder layer's products after their norms: the residual add and norm, q/k/v; again, gate/up."""

    def __init__(self, d: int = 64, kv: int = 32, hidden: int = 96, norm: str = "rms", bias: bool = False) -> None:
        super().__init__()
        make = RMSNorm if norm == "rms" else nn.LayerNorm
        self.norm1, self.norm2 = make(d), make(d)
        self.q, self.k, self.v = nn.Linear(d, d, bias=bias), nn.Linear(d, kv, bias=bias), nn.Linear(d, kv, bias=bias)
        self.o = nn.Linear(d, d, bias=bias)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + x
        y = self.norm1(h)
        q, k, v = self.q(y), self.k(y), self.v(y)
        h = h + self.o(q * torch.cat([k, v], dim=-1))
        y = self.norm2(h)
        return h + self.down(nn.functional.silu(self.gate(y)) * self.up(y))


def run_passes(program: Program, registry: KernelRegistry) -> Program:
    return fuse_gemv_prologue(fuse(fuse_gemv(program, registry), registry), registry)


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple,
                   checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    with torch.no_grad():
        return compile_with_pass(monkeypatch, model.eval(), example, "fusion", run_passes, checks,  # type: ignore[no-any-return]
                                 {"atol": 1e-4, "rtol": 1e-4}, leave_out=("split_bias", "lift_views"))  # fmt: skip


def inputs(d: int = 64, rows: int = 1, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple:
    return tuple(torch.randn(rows, 1, d, dtype=dtype, device=device) for _ in range(2))


def prologues(specs: list[FusedKernel]) -> list[FusedKernel]:
    return [s for s in specs if "its row computed first" in s.describe]


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("bias", [False, True])
def test_each_norm_is_the_first_step_of_the_products_that_read_it(
    monkeypatch: pytest.MonkeyPatch, norm: str, bias: bool
) -> None:
    model = Layer(norm=norm, bias=bias)
    example = inputs()
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    merged = prologues(specs)
    assert len(merged) == 2, [s.describe for s in specs]
    qkv, mlp = sorted(merged, key=lambda s: "silu" in s.describe)
    assert "3 product(s) of one row of 64" in qkv.describe and "silu(gate) * up" in mlp.describe
    assert "row kernel, 1 rows of 64" in qkv.describe
    # each residual sum is an output of the products' kernel: the next add reads it
    assert len(qkv.outputs) == 4 and len(mlp.outputs) == 2
    forward = compiled.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    calls = [line.split("  # ")[0] for line in forward.splitlines()]  # the code, not the comments naming nodes
    assert not any("native_layer_norm(" in c or "rsqrt(" in c for c in calls)  # no norm of its own
    assert not any(s.describe.startswith("row kernel") for s in specs)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]
    for spec in merged:
        assert "def _prologue(" in spec.source and "if STORE:" in spec.source
        assert all(dict(meta)["BLOCK_K"] == 64 for meta, *_ in spec.configs)  # the whole row in one step


@pytest.mark.parametrize(("d", "merges"), [(2048, 2), (2304, 0)])
def test_a_row_read_again_by_too_many_programs_keeps_its_kernel(monkeypatch: pytest.MonkeyPatch, d: int,
                                                                merges: int) -> None:  # fmt: skip
    """Every program reads the group's inputs (3 rows of d) again. A row of 2048 takes tiles of 4 and 8 rows;
    one of 2304 pads them to 4096 columns, which then hold 2 and 4 rows: the reads come to 0.75 of the
    weights' bytes (over MAX_REREAD), and each norm stays a kernel of its own."""
    _, specs = compile_on_cpu(monkeypatch, Layer(d=d, kv=d // 2, hidden=16), inputs(d))
    assert len(prologues(specs)) == merges, [s.describe for s in specs]
    assert sum(s.describe.startswith("row kernel") for s in specs) == 2 - merges


def test_the_kernel_reads_its_weights_then_computes_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_on_cpu(monkeypatch, Layer(), inputs())
    qkv = next(s for s in prologues(specs) if "silu" not in s.describe)
    source = qkv.source.split("def _rows(")[1]  # the helper each program runs
    assert source.index("tile = tl.load(w") < source.index("xs = ") < source.index("tl.sum(tile")
    assert "_prologue(in0, in1, in2, out0, tl.program_id(0) == 0, BLOCK_K)" in source
    assert "def gemv_" in source and "(p_in0, p_in1, p_in2, w0, w1, w2, p_out0, out0, out1, out2, BLOCK_N" in source
    assert "_rows(p_in0, p_in1, p_in2, p_out0, w0, out0, out0, pid, 64" in qkv.source  # the first product


class ReadTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.q = RMSNorm(64), nn.Linear(64, 64, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(residual + x)
        return self.q(y), y  # the norm's output is read by the caller too


class PostNorm(nn.Module):
    """OLMo-2's post-norm layer after attention: `h = residual + norm(o(x))` feeds the MLP's products and
    the residual add after them."""

    def __init__(self, d: int = 64, hidden: int = 96) -> None:
        super().__init__()
        self.norm1, self.norm2, self.o = RMSNorm(d), RMSNorm(d), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + self.norm1(self.o(x))
        return h + self.norm2(self.down(nn.functional.silu(self.gate(h)) * self.up(h)))


@pytest.mark.parametrize("model", [ReadTwice, PostNorm], ids=["returned", "post_norm"])
def test_a_row_also_read_after_the_products_is_stored_by_their_kernel(
    monkeypatch: pytest.MonkeyPatch, model: type[nn.Module]
) -> None:
    layer, example = model(), inputs()
    compiled, specs = compile_on_cpu(monkeypatch, layer, example)
    (merged,) = prologues(specs)
    assert len(merged.outputs) == 2 and "if STORE:" in merged.source  # the row, stored, and the products'
    rows_left = sum(s.describe.startswith("row kernel") for s in specs)  # the post-norm's last norm and add
    assert rows_left == (1 if model is PostNorm else 0), [s.describe for s in specs]
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), layer(*example))  # type: ignore[operator]


def test_what_does_not_fit_keeps_its_two_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row longer than MAX_K, two rows: the kernels stay apart."""
    wide = MAX_K + 16
    _, specs = compile_on_cpu(monkeypatch, Layer(d=wide, kv=wide // 2, hidden=32), inputs(wide))
    assert prologues(specs) == [] and any("matrix-vector kernel" in s.describe for s in specs)
    _, specs = compile_on_cpu(monkeypatch, Layer(), inputs(rows=2))
    assert prologues(specs) == [] and any("few-row kernel" in s.describe for s in specs)


@interpreter
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_the_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                              norm: str) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model = Layer(d=80, kv=40, hidden=70, norm=norm, bias=True)  # a row that no power of two fits
    checks: list[str] = []
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(80), checks=checks)
    example = inputs(80)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert {s.name for s in prologues(specs)} <= set(checks) and len(prologues(specs)) == 2


@interpreter
def test_a_stored_row_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                 request: pytest.FixtureRequest) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model, checks = PostNorm(d=80, hidden=70), []
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(80), checks=checks)
    example = inputs(80)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    (merged,) = prologues(specs)
    assert len(merged.outputs) == 2 and merged.name in checks


TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


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
            compiled = opgen.compile(model, inputs(256, dtype=dtype, device="cuda"), cuda_graphs=graphs, cache=False)
            assert str(compiled.report()).count("its row computed first") == 2, compiled.report()
            for _ in range(3):
                example = inputs(256, dtype=dtype, device="cuda")
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
    example = inputs(2048, dtype=dtype, device="cuda")
    with torch.no_grad():
        compiled = opgen.compile(model, example, cache=False)
        torch.testing.assert_close(compiled(*example), model(*example), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert str(compiled.report()).count("its row computed first") == 2


def test_launched_dependently_it_reads_its_weights_before_the_wait() -> None:
    from opgen.runtime.codegen.triton import gemv_prologue
    from opgen.runtime.codegen.triton.dependent_launch import SIGNAL, WAIT
    from opgen.runtime.codegen.triton.gemv import dependent_helper

    for helper in (gemv_prologue._ROWS, gemv_prologue._GATED):
        source = dependent_helper(helper.replace("{x}", "in0, out0"), True)
        assert source.index(SIGNAL) < source.index("tl.load(w") < source.index(WAIT) < source.index("_prologue(in0")
        assert WAIT not in dependent_helper(helper.replace("{x}", "in0"), False)
