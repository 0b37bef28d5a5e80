"""The `split_products` pass without a GPU: a product whose result is only split along its columns (Phi-3's
fused gate/up weight) becomes a product per piece, which `gemv` then takes as Llama's separate products.

As in `test_gemv.py`, the programs are relabelled as CUDA around the passes and each kernel is bound to
the ATen calls it replaced (or run in Triton's interpreter, every config checked against them)."""

from __future__ import annotations

import pytest
import torch
from fusion_interp import needs_triton, ran_in_fresh_interpreter, run_passes_as_if_cuda
from test_gemv import compile_gemv
from torch import nn

import opgen
from opgen.runtime import pipeline
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel, KernelCall, Program
from opgen.runtime.passes import DEFAULT_PIPELINE
from opgen.runtime.passes.fusion.split_products import split_products

torch.manual_seed(0)


class FusedGateUp(nn.Module):
    """Phi-3's MLP: one gate/up weight, its product chunked in two, `up * silu(gate)`, then down."""

    def __init__(self, d: int = 64, hidden: int = 96) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(up * nn.functional.silu(gate))


class SplitIntoAView(nn.Module):
    """A piece read by a reshape (heads of a fused q/k/v): left as one product."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 96, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, kv = self.qkv(x).split([64, 32], dim=-1)
        return q.reshape(*q.shape[:-1], 4, 16).sum(-1) + kv.sum(-1, keepdim=True)


class SplitOfRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 96, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.proj(x).chunk(2, dim=0)  # rows, not columns
        return torch.relu(a) + torch.relu(b)


def compile_split(
    monkeypatch: pytest.MonkeyPatch, model: nn.Module, x: torch.Tensor, checks: list[str] | None = None
) -> tuple[object, list[FusedKernel], list[Program]]:
    """`test_gemv.compile_gemv` with `split_products` first; also returns the program `split_products` made."""
    made: list[Program] = []
    compiled, specs = compile_gemv(monkeypatch, model, (x,), checks, before=(split_products,), made=made)
    return compiled, specs, made


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (1, 1, 64), (8, 64), (3, 1, 64)])
def test_a_chunked_gate_up_product_is_the_gated_kernel(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    model = FusedGateUp().to(dtype)
    compiled, specs, (program,) = compile_split(monkeypatch, model, torch.randn(shape, dtype=dtype))
    assert sorted(s.describe.split(", ", 1)[1] for s in specs) == sorted(
        [f"silu(gate) * up of {'one row' if shape[0] == 1 else f'{shape[0]} rows'} of 64: 96 rows",
         f"1 product(s) of {'one row' if shape[0] == 1 else f'{shape[0]} rows'} of 96: 64 rows"]
    )  # fmt: skip
    pieces = [line for line in program.setup if isinstance(line, KernelCall) and line.target == "aten.slice.Tensor"]
    assert [line.args[1:] for line in pieces] == [(1, 0, 96), (1, 96, 192)]  # views of the weight's columns
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]


@pytest.mark.parametrize("model", [SplitIntoAView(), SplitOfRows()], ids=["into a view", "of rows"])
def test_other_splits_keep_their_one_product(monkeypatch: pytest.MonkeyPatch, model: nn.Module) -> None:
    x = torch.randn(2, 64)
    compiled, specs, (program,) = compile_split(monkeypatch, model, x)
    assert sum(isinstance(line, KernelCall) and line.target == "aten.mm.default" for line in program.body) == 1
    assert [s.describe.split(": ")[1] for s in specs] == ["96 rows"]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]


@needs_triton
@pytest.mark.parametrize("rows", [1, 8])
def test_the_split_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                                    rows: int) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model, checks = FusedGateUp(d=80, hidden=70), []  # sizes that not every tile divides
    compiled, specs, _ = compile_split(monkeypatch, model, torch.randn(rows, 80), checks=checks)
    x = torch.randn(rows, 80)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert any("silu(gate) * up" in s.describe for s in specs) and sorted(checks) == sorted(s.name for s in specs)


def test_phi3_layers_take_the_llama_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny Phi-3's decode step with the whole pipeline as on CUDA: its gate/up product is the gated kernel,
    with the norm before it, and no pointwise kernel is left for `up * silu(gate)`."""
    pytest.importorskip("transformers")
    from opgen.bench.llm_families import causal_lm, step

    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    monkeypatch.setattr(fused_module, "bindings", lambda found: {s.local: (lambda aten: aten) for s in found})
    lm = causal_lm("phi3", "tiny")
    eager, mine = step(lm, 32), step(lm, 32)
    with torch.no_grad():
        example = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]))
        fn = opgen.compile(mine, example, passes=DEFAULT_PIPELINE, cache=False)
        jit = fn.report().jit  # type: ignore[attr-defined]
        gated = [line for line in jit if "silu(gate) * up" in line]
        assert len(gated) == lm.config.num_hidden_layers and all("its row computed first" in g for g in gated), jit
        assert not [line for line in jit if "pointwise kernel" in line and "silu" in line], jit
        for pos in range(3):
            ids = torch.randint(1, 100, (1, 1))
            torch.testing.assert_close(fn(ids, torch.tensor([pos])), eager(ids, torch.tensor([pos])),  # type: ignore[operator]
                                       atol=1e-4, rtol=1e-4)  # fmt: skip
