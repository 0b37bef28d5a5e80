"""The `transpose_weights` pass without a GPU: products on constant weights stored [K, N] row-major (GPT-2's
`Conv1D`) read a copy made once in setup in a linear layer's layout, and `gemv` takes them.

As in `test_gemv.py`, the programs are relabelled as CUDA around the passes and each kernel is bound to
the ATen calls it replaced (or run in Triton's interpreter, every config checked against them)."""

from __future__ import annotations

import pytest
import torch
from fusion_interp import needs_triton, ran_in_fresh_interpreter
from test_gemv import compile_gemv
from torch import nn

import opgen
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel, KernelCall, Program
from opgen.runtime.passes.fusion.weight_layout import transpose_weights

torch.manual_seed(0)


class Conv1D(nn.Module):
    """GPT-2's linear layer: its weight [K, N], `addmm(b, x, W)`."""

    def __init__(self, k: int, n: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.1)
        self.bias = nn.Parameter(torch.randn(n) * 0.1) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(-1, x.size(-1))
        y = torch.addmm(self.bias, flat, self.weight) if self.bias is not None else flat @ self.weight
        return y.view(*x.shape[:-1], -1)


class MLP(nn.Module):
    def __init__(self, d: int = 64, hidden: int = 96, bias: bool = True) -> None:
        super().__init__()
        self.fc, self.proj = Conv1D(d, hidden, bias), Conv1D(hidden, d, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.relu(self.fc(x)))


class SharedWeight(nn.Module):
    """One [K, N] weight read by two products: one copy."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 64) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + y @ self.weight


class BufferWeight(nn.Module):
    """A [K, N] buffer the graph writes: not a constant, not copied."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.mul_(1.0)
        return x @ self.weight


def compile_layout(
    monkeypatch: pytest.MonkeyPatch, model: nn.Module, inputs: tuple[torch.Tensor, ...], checks: list[str] | None = None
) -> tuple[object, list[FusedKernel], list[Program]]:
    """`test_gemv.compile_gemv` with `transpose_weights` first; also returns the program `transpose_weights` made."""
    made: list[Program] = []
    compiled, specs = compile_gemv(monkeypatch, model, inputs, checks, before=(transpose_weights,), made=made)
    return compiled, specs, made


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (1, 1, 64), (8, 64)])
def test_a_row_major_weight_is_copied_once_and_its_products_take_the_kernels(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, bias: bool, shape: tuple[int, ...]
) -> None:
    model = MLP(bias=bias).to(dtype)
    x = torch.randn(shape, dtype=dtype)
    compiled, specs, (program,) = compile_layout(monkeypatch, model, (x,))
    assert sorted(s.describe.split(": ")[1] for s in specs) == ["64 rows", "96 rows"]
    clones = [line for line in program.setup if isinstance(line, KernelCall) and line.target == "aten.clone.default"]
    assert len(clones) == 2 and all(c.outputs[0].meta.is_contiguous() for c in clones)  # type: ignore[union-attr]
    size = 64 * 96 * 2 * (4 if dtype == torch.float32 else 2) / 2**20  # the two weights, not the biases
    (note,) = (n for n in program.notes if "transpose_weights" in n)
    assert f"[K, N] (2, {size:.1f} MiB)" in note and note in str(compiled.report())  # type: ignore[attr-defined]
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]


def test_a_weight_read_twice_is_copied_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, y = SharedWeight(), torch.randn(1, 64), torch.randn(1, 64)
    compiled, specs, (program,) = compile_layout(monkeypatch, model, (x, y))
    assert sum(isinstance(line, KernelCall) and line.target == "aten.clone.default" for line in program.setup) == 1
    assert len(specs) == 2
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), model(x, y))  # type: ignore[operator]


@pytest.mark.parametrize("case", ["rows", "buffer", "linear"])
def test_what_gemv_would_not_take_is_left_alone(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    model: nn.Module = {"rows": MLP(), "buffer": BufferWeight(), "linear": nn.Linear(64, 32)}[case]
    x = torch.randn(65 if case == "rows" else 1, 64)  # 65 rows: a matrix product, cuBLAS's
    compiled, specs, (program,) = compile_layout(monkeypatch, model, (x,))
    assert not any(isinstance(line, KernelCall) and line.target == "aten.clone.default" for line in program.setup)
    assert len(specs) == (1 if case == "linear" else 0)  # a linear layer's weight needs no copy
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]


@needs_triton
@pytest.mark.parametrize("rows", [1, 8])
def test_the_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                              rows: int) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model, checks = MLP(d=80, hidden=70), []  # sizes that not every tile divides
    compiled, specs, _ = compile_layout(monkeypatch, model, (torch.randn(rows, 80),), checks=checks)
    x = torch.randn(rows, 80)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert len(specs) == 2 and sorted(checks) == sorted(s.name for s in specs)


def test_gpt2_products_take_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny GPT-2's decode step with the whole pipeline as on CUDA: no product is left to cuBLAS, and its layer
    norms are the first step of the products that read them."""
    pytest.importorskip("transformers")
    from fusion_interp import run_passes_as_if_cuda

    from opgen.bench.llm_families import causal_lm, step
    from opgen.runtime import pipeline
    from opgen.runtime.passes import DEFAULT_PIPELINE

    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    monkeypatch.setattr(fused_module, "bindings", lambda found: {s.local: (lambda aten: aten) for s in found})
    lm = causal_lm("gpt2", "tiny")
    eager, mine = step(lm, 32), step(lm, 32)
    with torch.no_grad():
        fn = opgen.compile(mine, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0])), passes=DEFAULT_PIPELINE,
                           cache=False)  # fmt: skip
        products = [line for line in fn.report().jit if "matrix-vector kernel" in line]  # type: ignore[attr-defined]
        layers = lm.config.n_layer
        assert len(products) == 4 * layers + 1, products  # four a layer and the head
        assert sum("its row computed first" in p for p in products) == 2 * layers + 1  # the norms before c_attn, c_fc
        for pos in range(3):
            ids = torch.randint(1, 100, (1, 1))
            torch.testing.assert_close(fn(ids, torch.tensor([pos])), eager(ids, torch.tensor([pos])),  # type: ignore[operator]
                                       atol=1e-4, rtol=1e-4)  # fmt: skip
