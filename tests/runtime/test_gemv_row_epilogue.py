"""Norms computed by the last program of the product kernel before them (`passes.fusion.gemv_row_epilogue`).

Without a GPU the program is relabelled as CUDA around the passes (as for the other kernel passes); each
kernel is bound to the ATen calls it replaced, or, where triton is installed, run in Triton's interpreter
with every config, one after another on the same counter, and checked against them. With a GPU the
kernels run for real: forced, picked, in CUDA-graph mode (replayed), and every config launched.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from fusion_interp import InterpretedBinding, compile_with_pass, ran_in_fresh_interpreter
from test_gemv_prologue import RMSNorm
from torch import nn

import opgen
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.passes.fusion.gemv import fuse_gemv
from opgen.runtime.passes.fusion.gemv_prologue import fuse_gemv_prologue
from opgen.runtime.passes.fusion.gemv_row_epilogue import fuse_gemv_row_epilogue
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.registry import KernelRegistry

torch.manual_seed(0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)
LAST = "its last program computing"


class PostNorms(nn.Module):
    """Gemma-2's layer around its products: after the attention's output projection its post-norm, the
    residual add and the MLP's pre-norm (one row group); after the down projection its post-norm, the
    residual add and the next layer's input norm."""

    def __init__(self, d: int = 64, hidden: int = 96) -> None:
        super().__init__()
        self.post1, self.pre2, self.post2, self.next = RMSNorm(d), RMSNorm(d), RMSNorm(d), RMSNorm(d)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + self.post1(self.o(x))
        y = self.pre2(h)
        h = h + self.post2(self.down(nn.functional.gelu(self.gate(y), approximate="tanh") * self.up(y)))
        return self.next(h), h


class ReadElsewhere(nn.Module):
    """The product is returned too: its row group stays a kernel of its own."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.o, self.norm = nn.Linear(d, d, bias=False), RMSNorm(d)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.o(x)
        return self.norm(residual + o), o


def without_prologue(program: Program, registry: KernelRegistry) -> Program:
    """The passes with no norm taken as a prologue first: every norm after a product is this pass's."""
    return fuse_gemv_row_epilogue(fuse(fuse_gemv(program, registry), registry), registry)


def in_order(program: Program, registry: KernelRegistry) -> Program:
    """The default pipeline's order: the prologue takes the norms it can first."""
    merged = fuse_gemv_prologue(fuse(fuse_gemv(program, registry), registry), registry)
    return fuse_gemv_row_epilogue(merged, registry)


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple, run=without_prologue,
                   checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    with torch.no_grad():
        return compile_with_pass(monkeypatch, model.eval(), example, "fusion", run, checks,  # type: ignore[no-any-return]
                                 {"atol": 1e-4, "rtol": 1e-4}, leave_out=("split_bias", "lift_views"))  # fmt: skip


def inputs(d: int = 64, rows: int = 1, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple:
    return tuple(torch.randn(rows, 1, d, dtype=dtype, device=device) for _ in range(2))


def ended(specs: list[FusedKernel]) -> list[FusedKernel]:
    return [s for s in specs if LAST in s.describe]


def rows_left(specs: list[FusedKernel]) -> int:
    return sum(s.describe.startswith("row kernel") for s in specs)


def test_each_norm_after_a_product_is_computed_by_its_last_program(monkeypatch: pytest.MonkeyPatch) -> None:
    model, example = PostNorms(), inputs()
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    merged = ended(specs)
    assert len(merged) == 2 and rows_left(specs) == 0, [s.describe for s in specs]
    o, down = sorted(merged, key=lambda s: "of one row of 96" in s.describe)
    assert "1 product(s) of one row of 64: 64 rows" in o.describe and "of one row of 96" in down.describe
    assert "row kernel, 1 rows of 64" in o.describe
    for spec in merged:  # the product, then both outputs of the group (the residual sum and the norm)
        assert len(spec.outputs) == 3 and [v.meta.dtype for v in spec.writes] == ["int32"]  # type: ignore[union-attr]
        assert spec.inputs[-1] == spec.writes[0].name  # the counter, last of the inputs
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_each_kernel_has_a_zeroed_counter_made_in_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, specs = compile_on_cpu(monkeypatch, PostNorms(), inputs())
    counters = {s.writes[0].name for s in ended(specs)}
    assert len(counters) == 2
    setup = compiled.artifact.source.split("def forward(")[0]  # type: ignore[attr-defined]
    for name in counters:
        assert f"{name} = " in setup and "zeros(" in setup.split(f"{name} = ")[1].splitlines()[0]


def test_the_last_program_takes_the_row_after_its_ticket(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_on_cpu(monkeypatch, PostNorms(), inputs())
    source = ended(specs)[0].source
    kernel = source.split("@triton.jit\ndef gemv_")[1]
    order = ["_rows(", "tl.debug_barrier()", 'tl.atomic_add(count, 1, sem="acq_rel")',
             "if ticket == tl.num_programs(0) - 1:", "tl.atomic_xchg(count, 0)", "_row(out0, "]  # fmt: skip
    assert [kernel.index(s) for s in order] == sorted(kernel.index(s) for s in order)
    assert "count, out0, r_out0, r_out1, BLOCK_N" in kernel  # the counter, the product, the group's outputs
    row = source.split("def _row(")[1].split("@triton.jit")[0]
    loads = [line for line in row.splitlines() if "tl.load(" in line]
    assert sum('cache_modifier=".cg"' in line for line in loads) == 1  # the product, which other programs wrote
    assert 'tl.load(in0 + cols, mask=cmask, cache_modifier=".cg")' in row


def test_the_prologue_keeps_the_norms_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the default order a norm that the products after it can compute goes there (no program waits);
    the one no product reads (the next layer's norm, returned here) goes to the product before it."""
    model, example = PostNorms(), inputs()
    compiled, specs = compile_on_cpu(monkeypatch, model, example, run=in_order)
    assert sum("its row computed first" in s.describe for s in specs) == 1
    (merged,) = ended(specs)
    assert "of one row of 96" in merged.describe and rows_left(specs) == 0
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_rows_the_prologue_refuses_go_to_the_product_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma-2's width: the prologue's programs would read four rows of 2304 again (tiles padded to 4096)."""
    model, example = PostNorms(d=2304, hidden=16), inputs(2304)
    compiled, specs = compile_on_cpu(monkeypatch, model, example, run=in_order)
    assert len(ended(specs)) == 2 and rows_left(specs) == 0, [s.describe for s in specs]
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example), atol=1e-4, rtol=1e-4)  # type: ignore[operator]


@pytest.mark.parametrize("case", ["read_elsewhere", "two_rows"])
def test_what_does_not_fit_keeps_its_two_kernels(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    model, example = (ReadElsewhere(), inputs()) if case == "read_elsewhere" else (PostNorms(), inputs(rows=2))
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    assert ended(specs) == [] and rows_left(specs) >= 1, [s.describe for s in specs]
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


@interpreter
def test_the_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Every config on the same counter, one after another, and two calls: a config that left the counter
    unfit would fail the next launch."""
    if ran_in_fresh_interpreter(request):
        return
    model, checks = PostNorms(d=80, hidden=70), []  # rows that no power of two fits
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(80), checks=checks)
    assert len(ended(specs)) == 2
    for _ in range(2):
        example = inputs(80)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*example), model(*example), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert {s.name for s in ended(specs)} <= set(checks)


# bfloat16 at Gemma-2's width: the residual sums reach a few units (steps of 1/64 there), and a sum rounded
# the other way moves a norm's output near zero by one such step (2.4e-2 seen against eager's).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("force", ["triton", None])
def test_on_the_gpu_plain_and_in_graph_mode(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                            force: str | None) -> None:  # fmt: skip
    if force is not None:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    model = PostNorms(d=2304, hidden=512).to(device="cuda", dtype=dtype).eval()
    eager = copy.deepcopy(model)
    tol = TOLERANCE[dtype]
    for graphs in (False, True):
        with torch.no_grad():
            compiled = opgen.compile(model, inputs(2304, dtype=dtype, device="cuda"), cuda_graphs=graphs, cache=False)
            assert str(compiled.report()).count(LAST) == 2, compiled.report()
            for _ in range(3):
                example = inputs(2304, dtype=dtype, device="cuda")
                got = [t.clone() for t in compiled(*example)]
                torch.testing.assert_close(got, list(eager(*example)), atol=tol, rtol=tol)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_config_on_the_gpu(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    checks: list[str] = []
    tolerance = {"atol": TOLERANCE[dtype], "rtol": TOLERANCE[dtype]}
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    model = PostNorms(d=2304, hidden=1024).to(device="cuda", dtype=dtype).eval()
    with torch.no_grad():
        compiled = opgen.compile(model, inputs(2304, dtype=dtype, device="cuda"), cache=False)
        for _ in range(2):
            example = inputs(2304, dtype=dtype, device="cuda")
            torch.testing.assert_close(compiled(*example), model(*example), **tolerance)
    assert str(compiled.report()).count(LAST) == 2 and len(checks) >= 2
