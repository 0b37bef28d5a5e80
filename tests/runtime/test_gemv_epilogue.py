"""Activations (any pointwise group of one output) as the last step of the product kernel before them
(`passes.fusion.gemv_epilogue`), without a GPU: what merges and what stays apart, the source, the ATen
side against eager, and every config in Triton's interpreter against the ATen calls."""

from __future__ import annotations

import pytest
import torch
from fusion_interp import compile_with_pass, needs_triton, ran_in_fresh_interpreter
from torch import nn

from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.passes.fusion.gemv import fuse_gemv
from opgen.runtime.passes.fusion.gemv_epilogue import fuse_gemv_epilogue
from opgen.runtime.passes.fusion.gemv_prologue import fuse_gemv_prologue
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.registry import KernelRegistry

torch.manual_seed(0)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's activation, written out as transformers writes it (eight pointwise ops)."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    """A norm (optional), fc, an activation (a group of ops or a lone op), proj and the residual add (of half of
    it: two ops, one group)."""

    def __init__(self, d: int = 64, hidden: int = 96, norm: bool = True, act: str = "gelu_new") -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d) if norm else nn.Identity()
        self.fc, self.proj = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.act = {"gelu_new": gelu_new, "relu2": lambda x: torch.relu(x) ** 2, "relu": torch.relu,
                    "gelu": nn.functional.gelu}[act]  # fmt: skip

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + x
        return h + 0.5 * self.proj(self.act(self.fc(self.norm(h))))


def run_passes(program: Program, registry: KernelRegistry) -> Program:
    return fuse_gemv_epilogue(fuse_gemv_prologue(fuse(fuse_gemv(program, registry), registry), registry), registry)


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple,
                   checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    with torch.no_grad():
        return compile_with_pass(monkeypatch, model.eval(), example, "fusion", run_passes, checks,  # type: ignore[no-any-return]
                                 {"atol": 1e-4, "rtol": 1e-4}, leave_out=("split_bias", "lift_views"))  # fmt: skip


def inputs(rows: int = 1, d: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, 1, d), torch.randn(rows, 1, d)


def ending(specs: list[FusedKernel]) -> list[FusedKernel]:
    return [s for s in specs if ", ending with its pointwise kernel" in s.describe]


@pytest.mark.parametrize("act", ["gelu_new", "relu2", "relu", "gelu"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_the_activation_is_the_products_last_step(monkeypatch: pytest.MonkeyPatch, act: str, norm: bool,
                                                  rows: int) -> None:  # fmt: skip
    model = MLP(norm=norm, act=act)
    example = inputs(rows)
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    fc = next(s for s in ending(specs) if "96 rows" in s.describe)
    assert len(ending(specs)) == 2, [s.describe for s in specs]  # proj ends with the residual add
    assert ("its row computed first" in fc.describe) == (norm and rows == 1)
    assert not any(s.describe.startswith("pointwise kernel") for s in specs), [s.describe for s in specs]
    assert "def _epilogue(y, offs, mask):" in fc.source  # the activation reads nothing but the product
    assert "_epilogue(y, rows, row_ok)" in fc.source if rows == 1 else "_epilogue(acc, ms[:, None] * N" in fc.source
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_a_residual_add_reads_its_other_input_where_the_product_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last add is proj's epilogue, its other input (the residual sum) loaded at the product's elements."""
    model = MLP(norm=False)
    example = inputs(1)
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    merged = ending(specs)
    assert len(merged) == 2, [s.describe for s in specs]
    proj = next(s for s in merged if "of one row of 96" in s.describe)
    assert "def _epilogue(in0, y, offs, mask):" in proj.source or "def _epilogue(in1, y, offs, mask):" in proj.source
    assert "e_in" in proj.source.split("def gemv_")[1].split(")")[0]  # the kernel takes the residual
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


class ReadTwice(nn.Module):
    def __init__(self, lone: bool = False) -> None:
        super().__init__()
        self.fc, self.lone = nn.Linear(64, 96), lone

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return h, torch.relu(h) if self.lone else torch.relu(h) ** 2


class Broadcast(nn.Module):
    """The activation's space is wider than the product (the product broadcast along a new dimension)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x)[:, None, :] * y + 1.0


@pytest.mark.parametrize(
    ("model", "example"),
    [(ReadTwice(), (torch.randn(1, 64),)), (ReadTwice(lone=True), (torch.randn(1, 64),)),
     (Broadcast(), (torch.randn(1, 64), torch.randn(1, 4, 32)))],
)  # fmt: skip
def test_products_read_elsewhere_or_broadcast_keep_their_kernels(monkeypatch: pytest.MonkeyPatch,
                                                                 model: nn.Module, example: tuple) -> None:  # fmt: skip
    compiled, specs = compile_on_cpu(monkeypatch, model, example)
    assert ending(specs) == [], [s.describe for s in specs]
    lone = [s for s in specs if s.describe.startswith("pointwise kernel") and len(s.nodes) == 1]
    assert lone == [], [s.describe for s in lone]  # a lone op that stays apart stays ATen's call
    with torch.no_grad():
        torch.testing.assert_close(compiled(*example), model(*example))  # type: ignore[operator]


def test_the_kernel_is_named_by_its_epilogue_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two products alike but for what they end with are two kernels (the name hashes the helpers)."""
    _, relu = compile_on_cpu(monkeypatch, MLP(norm=False, act="relu2"), inputs())
    _, gelu = compile_on_cpu(monkeypatch, MLP(norm=False, act="gelu_new"), inputs())
    names = {s.name for s in ending(relu) + ending(gelu) if "of one row of 64" in s.describe}
    assert len(names) == 2, names


@needs_triton
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_every_config_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                                 norm: bool, rows: int) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model = MLP(d=80, hidden=70, norm=norm)  # sizes that not every tile divides
    checks: list[str] = []
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(rows, 80), checks=checks)
    assert ending(specs)
    for _ in range(2):
        example = inputs(rows, 80)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*example), model(*example), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert sorted(checks) == sorted([s.name for s in specs] * 2)


def _gpu_jit() -> bool:
    if not torch.cuda.is_available():
        return False
    from opgen.jit.env import available

    return bool(available())


@pytest.mark.skipif(not _gpu_jit(), reason="needs a CUDA GPU, a CUDA build of opgen and triton")
@pytest.mark.parametrize("force", ["triton", None])
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("rows", [1, 8])
def test_on_the_gpu(monkeypatch: pytest.MonkeyPatch, force: str | None, graphs: bool, rows: int) -> None:
    """The merged kernels (gelu_new after fc, the residual add after proj) in bfloat16 against eager, the
    Triton side forced and as the first call picks, plain and replayed in a CUDA graph."""
    import opgen

    if force is not None:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    model = MLP(d=256, hidden=1024).to(device="cuda", dtype=torch.bfloat16).eval()
    make = lambda: tuple(t.to(device="cuda", dtype=torch.bfloat16) for t in inputs(rows, 256))  # noqa: E731
    with torch.no_grad():
        compiled = opgen.compile(model, make(), cuda_graphs=graphs)
        for _ in range(3):
            example = make()
            torch.testing.assert_close(compiled(*example).clone(), model(*example), atol=3e-2, rtol=3e-2)  # type: ignore[operator]
    report = str(compiled.report())
    assert report.count("ending with its pointwise kernel") == 2, report
