"""Independent pointwise kernels in one launch (`passes.fusion.horizontal`): the rotary embedding of the
queries and of the keys, which read the same angles and nothing of each other; and independent row kernels
(OLMo-2's query and key norms).

Without a GPU the program is relabelled as CUDA around the fusion passes; each kernel is bound to its
ATen calls, or, where triton is installed, run in Triton's interpreter with every config. With a GPU
the kernels run for real.
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
from opgen.runtime.passes.fusion.horizontal import fuse_horizontal
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.registry import KernelRegistry

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    """transformers' apply_rotary_pos_emb on one decode step's queries and keys, then a product of them
    (`between`: the queries' rotation is read by a product before the keys' is made)."""

    def __init__(self, dim: int = 16, between: bool = False) -> None:
        super().__init__()
        self.between = between
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = q * cos + rotate_half(q) * sin
        if self.between:
            k = k + self.proj(q).mean(1, keepdim=True)
        k = k * cos + rotate_half(k) * sin
        return q @ k.transpose(-1, -2).mean(1, keepdim=True)


class GptFastRotary(nn.Module):
    """gpt-fast's rotary on one step's queries and keys: pairs rotated and stacked (`apply_rotary`), each
    result reshaped right after its kernel, then a product of them."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        from opgen.bench.decode_models import apply_rotary

        q = apply_rotary(q, freqs).transpose(1, 2)
        k = apply_rotary(k, freqs).transpose(1, 2)
        return q @ k.transpose(-1, -2).mean(1, keepdim=True)


def gpt_fast_inputs(dim: int = 16) -> tuple:
    return torch.randn(1, 1, 4, dim), torch.randn(1, 1, 2, dim), torch.randn(1, dim // 2, 2)


def inputs(dim: int = 16, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple:
    q = torch.randn(1, 4, 1, dim, dtype=dtype, device=device)
    k = torch.randn(1, 2, 1, dim, dtype=dtype, device=device)
    angles = torch.randn(1, 1, 1, dim, dtype=dtype, device=device)
    return q, k, angles.cos(), angles.sin()


def run_passes(program: Program, registry: KernelRegistry) -> Program:
    return fuse_horizontal(fuse(program, registry), registry)


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple,
                   checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    with torch.no_grad():
        return compile_with_pass(monkeypatch, model.eval(), example, "fusion", run_passes, checks,  # type: ignore[no-any-return]
                                 {"atol": 1e-5, "rtol": 1e-5}, leave_out=("split_bias", "lift_views"))  # fmt: skip


def compile_gpt_fast(
    monkeypatch: pytest.MonkeyPatch, checks: list[str] | None = None
) -> tuple[object, list[FusedKernel]]:
    """`GptFastRotary` with lift_views, fusion and horizontal as if on CUDA (the stack fuses once lifted)."""
    from opgen.runtime.passes.fusion.lift_views import lift_views

    def passes(program: Program, registry: KernelRegistry) -> Program:
        return fuse_horizontal(fuse(lift_views(program, registry), registry), registry)

    with torch.no_grad():
        return compile_with_pass(monkeypatch, GptFastRotary().eval(), gpt_fast_inputs(), "fusion", passes, checks,  # type: ignore[no-any-return]
                                 {"atol": 1e-5, "rtol": 1e-5}, leave_out=("split_bias", "lift_views"))  # fmt: skip


def shared(specs: list[FusedKernel]) -> list[FusedKernel]:
    return [s for s in specs if s.describe.startswith("one launch for")]


def test_the_queries_and_keys_rotations_share_one_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    model, example = Rotary(), inputs()
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    (spec,) = shared(specs)
    assert spec.describe.startswith("one launch for 2 pointwise kernels: pointwise kernel over 1x4x1x16")
    assert "def _part0(" in spec.source and "def _part1(" in spec.source and "elif" not in spec.source
    # q, k, the halves rotate_half reads (views of them) and the angles: the angles once, though both read them
    assert len(spec.inputs) == len(set(spec.inputs)) == 8 and spec.inputs.count("cos__") == 1
    assert [len(s.outputs) for s in shared(specs)] == [2]
    for meta, _, _, grid in spec.configs:  # both groups' blocks
        block = dict(meta)["BLOCK"]
        assert grid == (-(-64 // block) + -(-32 // block),)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_a_kernel_whose_result_is_read_between_keeps_its_own_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    model, example = Rotary(between=True), inputs()
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    assert shared(specs) == []
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_views_of_a_rotated_tensor_between_the_kernels_move_after_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, specs = compile_gpt_fast(monkeypatch)
    (spec,) = shared(specs)  # the queries' reshape sat between the two kernels
    assert spec.describe.startswith("one launch for 2 pointwise kernels") and spec.nodes.count("cat") + sum(
        n.startswith("cat_") for n in spec.nodes) == 2  # fmt: skip
    example = gpt_fast_inputs()
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), GptFastRotary()(*example))  # type: ignore[operator]


@interpreter
def test_the_gpt_fast_kernel_matches_in_the_interpreter(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if ran_in_fresh_interpreter(request):
        return
    checks: list[str] = []
    compiled, specs = compile_gpt_fast(monkeypatch, checks)
    torch.manual_seed(1)
    example = gpt_fast_inputs()
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), GptFastRotary()(*example), atol=1e-5, rtol=1e-5)  # type: ignore[operator]
    assert shared(specs)[0].name in checks


@interpreter
def test_the_kernel_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    if ran_in_fresh_interpreter(request):
        return
    checks: list[str] = []
    model = Rotary(dim=24)
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(24), checks=checks)
    example = inputs(24)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example), atol=1e-5, rtol=1e-5)  # type: ignore[operator]
    assert [s.name for s in shared(specs)] == [c for c in checks if c == shared(specs)[0].name]


class RMSNorm(nn.Module):
    """transformers' hand-written RMSNorm (`nn.RMSNorm` calls `_fused_rms_norm` on CUDA with torch 2.11, which
    export keeps whole and kernel_ops does not bind)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = x.float()
        return self.weight * (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class QKNorms(nn.Module):
    """OLMo-2's query and key norms (RMSNorm over each whole projection), side by side, read after both."""

    def __init__(self, q: int = 64, k: int = 32) -> None:
        super().__init__()
        self.q_norm, self.k_norm = RMSNorm(q), RMSNorm(k)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


def test_the_query_and_key_norms_share_one_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    model, example = QKNorms(), (torch.randn(3, 1, 64), torch.randn(3, 1, 32))
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    (spec,) = shared(specs)
    assert spec.describe.startswith("one launch for 2 row kernels: row kernel, 3 rows of 64"), spec.describe
    assert "def _part0(" in spec.source and "BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr" in spec.source
    for meta, _, _, grid in spec.configs:  # both groups' blocks of rows, the longer row's BLOCK_N
        block_r, block_n = dict(meta)["BLOCK_R"], dict(meta)["BLOCK_N"]
        assert block_n == 64 and grid == (2 * -(-3 // block_r),)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_large_row_kernels_keep_their_own_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    model, example = QKNorms(), (torch.randn(2048, 64), torch.randn(2048, 32))  # 128K elements: over the limit
    _, specs = compile_on_cpu(monkeypatch, model, example)
    assert shared(specs) == []


@interpreter
@pytest.mark.parametrize("rows", [1, 5])
def test_the_row_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                                  rows: int) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    checks: list[str] = []
    model = QKNorms(q=48, k=20)  # rows of different lengths, neither a power of two
    example = (torch.randn(rows, 1, 48), torch.randn(rows, 1, 20))
    compiled, specs = compile_on_cpu(monkeypatch, model, example, checks=checks)
    example = (torch.randn(rows, 1, 48), torch.randn(rows, 1, 20))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example), atol=1e-5, rtol=1e-5)  # type: ignore[operator]
    assert shared(specs)[0].name in checks


def assert_near_eager(got: torch.Tensor, model: nn.Module, example: tuple, tol: float) -> None:
    """`got` against the model run in float32 on the same inputs, allowed twice the error eager makes in
    `got`'s dtype: the fused kernel keeps its rotations in float32, eager rounds them before the product's
    sum of 64 terms, so in bf16 the two part by more than a fixed tolerance allows."""
    want = copy.deepcopy(model).float()(*(t.float() for t in example))
    eager_err = float((model(*example).float() - want).abs().max())
    torch.testing.assert_close(got.float(), want, atol=2 * eager_err + tol, rtol=tol)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_gpu_plain_in_graph_mode_and_every_config(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    model = Rotary(dim=64).to(device="cuda", dtype=dtype).eval()
    eager = copy.deepcopy(model)
    for graphs in (False, True):
        with torch.no_grad():
            compiled = opgen.compile(model, inputs(64, dtype, "cuda"), cuda_graphs=graphs, cache=False)
            assert "one launch for 2 pointwise kernels" in str(compiled.report())
            example = inputs(64, dtype, "cuda")
            assert_near_eager(compiled(*example).clone(), eager, example, tol)
    checks: list[str] = []
    monkeypatch.setattr(
        fused_module,
        "bindings",
        lambda found: {s.local: InterpretedBinding(s, checks, {"atol": tol, "rtol": tol}) for s in found},
    )
    with torch.no_grad():
        compiled = opgen.compile(model, inputs(64, dtype, "cuda"), cache=False)
        example = inputs(64, dtype, "cuda")
        assert_near_eager(compiled(*example), eager, example, tol)
    assert checks


@cuda
@pytest.mark.parametrize("rows", [1, 8])
def test_the_row_kernels_on_the_gpu(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    model = QKNorms(q=2048, k=512).to(device="cuda", dtype=torch.bfloat16).eval()
    for graphs in (False, True):
        with torch.no_grad():
            example = (torch.randn(rows, 1, 2048, device="cuda", dtype=torch.bfloat16),
                       torch.randn(rows, 1, 512, device="cuda", dtype=torch.bfloat16))  # fmt: skip
            compiled = opgen.compile(model, example, cuda_graphs=graphs, cache=False)
            assert "one launch for 2 row kernels" in str(compiled.report())
            torch.testing.assert_close(compiled(*example), model(*example), atol=2e-2, rtol=2e-2)
