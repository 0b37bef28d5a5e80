"""The split-bias pass: which matrix products and convolutions lose their bias to an add, and that the
add then joins the fused kernel of their readers.

On the CPU the program is relabelled as CUDA around the passes (split_bias, then fusion); oneDNN's
passes are left out, so that linear layers stay `addmm` and convolutions `convolution`, as on CUDA.
Kernels are bound to their ATen calls, or where triton is installed and there is no GPU, run in
Triton's interpreter with every config and checked against them. With a GPU the models run for real.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from fusion_interp import CPU_PASSES, compile_with_pass, cpu_programs_unchanged, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.passes.fusion.bias import split_bias
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.registry import KernelRegistry

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)


class Mlp(nn.Module):
    """A linear layer, GELU, a linear layer; `shape` of the input (2-d or more)."""

    def __init__(self, width: int = 16, returned: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2, self.returned = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), returned

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.returned:  # the product is the output: its bias stays in cuBLAS
            return h
        return self.fc2(nn.functional.gelu(h)) * 2 + x


class ConvBlock(nn.Module):
    """Convolution, batch norm (folded into the convolution's bias), then SiLU or another convolution."""

    def __init__(self, then: str = "silu") -> None:
        super().__init__()
        self.conv, self.bn, self.then = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), then
        self.conv2 = nn.Conv2d(8, 8, 1, bias=False)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        return nn.functional.silu(y) if self.then == "silu" else self.conv2(y)


def split_then_fuse(program: Program, registry: KernelRegistry) -> Program:
    return fuse(split_bias(program, registry), registry)


def compiled(monkeypatch: pytest.MonkeyPatch, model: nn.Module, x: torch.Tensor,
             checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    return compile_with_pass(monkeypatch, model.eval(), (x,), "fusion", split_then_fuse, checks, leave_out=CPU_PASSES)


def kernels_called(fn: object) -> set[str]:
    """The kernels the source calls, without the memory plan's `_out` and in-place suffixes."""
    return {k.removesuffix("_out").removesuffix("_") for k in fn.artifact.kernels}  # type: ignore[attr-defined]


def convolutions(fn: object) -> list[str]:
    """The source lines calling the convolution kernel."""
    return [line.strip() for line in fn.artifact.source.splitlines() if "= convolution(" in line]  # type: ignore[attr-defined]  # plain and profiled


def check(fn: object, model: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)  # type: ignore[operator]


@pytest.mark.parametrize("shape", [(6, 16), (2, 3, 16)], ids=["2d", "3d"])
def test_a_linear_layer_read_by_pointwise_nodes_leaves_its_bias_to_their_kernel(monkeypatch, shape) -> None:
    model, x = Mlp(), torch.randn(*shape)
    fn, kernels = compiled(monkeypatch, model, x)
    assert "addmm" not in kernels_called(fn) and "mm" in kernels_called(fn)
    biased = [k for k in kernels if any(n.endswith("_bias") for n in k.nodes)]
    assert len(biased) == 2  # fc1's add with the GELU, fc2's with the scale and the residual add
    assert any({"addmm_bias", "gelu"} <= set(k.nodes) for k in biased)
    check(fn, model, x)


def test_a_product_the_graph_returns_keeps_its_bias(monkeypatch) -> None:
    model, x = Mlp(returned=True), torch.randn(6, 16)
    fn, kernels = compiled(monkeypatch, model, x)
    assert "addmm" in kernels_called(fn) and "mm" not in kernels_called(fn)
    assert kernels == []
    check(fn, model, x)


def test_a_convolution_read_by_an_activation_leaves_its_bias_to_its_kernel(monkeypatch) -> None:
    model, x = ConvBlock("silu"), torch.randn(2, 8, 6, 6)
    fn, kernels = compiled(monkeypatch, model, x)
    assert all(", None, (1, 1)" in conv for conv in convolutions(fn))  # the folded batch norm's bias: the kernel's
    (kernel,) = kernels
    assert any(n.endswith("_bias") for n in kernel.nodes) and "silu" in kernel.nodes
    check(fn, model, x)


def test_a_convolution_read_by_a_convolution_keeps_its_bias(monkeypatch) -> None:
    model, x = ConvBlock("conv"), torch.randn(2, 8, 6, 6)
    fn, kernels = compiled(monkeypatch, model, x)
    assert ", None, (1, 1)" not in convolutions(fn)[0] and kernels == []
    check(fn, model, x)


def test_a_scaled_product_keeps_its_bias(monkeypatch) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(16, 8)), nn.Parameter(torch.randn(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(torch.addmm(self.b, x, self.w, beta=0.5))

    model, x = Scaled(), torch.randn(4, 16)
    fn, _ = compiled(monkeypatch, model, x)
    assert "mm" not in kernels_called(fn)
    check(fn, model, x)


def test_cpu_programs_are_unchanged() -> None:
    cpu_programs_unchanged(ConvBlock("silu").eval(), (torch.randn(2, 8, 6, 6),), "split_bias")


@interpreter
@pytest.mark.parametrize("what", ["mlp", "conv"])
def test_the_kernels_with_the_bias_run_in_the_interpreter(monkeypatch, request, what) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model, x = (Mlp(), torch.randn(2, 3, 16)) if what == "mlp" else (ConvBlock("silu"), torch.randn(2, 8, 6, 6))
    checks: list[str] = []
    fn, kernels = compiled(monkeypatch, model, x, checks)
    check(fn, model, x)
    assert kernels and len(checks) >= len(kernels)


@cuda
@pytest.mark.parametrize("what", ["mlp", "conv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_on_the_gpu_the_bias_joins_the_readers_kernel(what, dtype) -> None:
    model, x = (Mlp(64), torch.randn(4, 32, 64)) if what == "mlp" else (ConvBlock("silu"), torch.randn(2, 8, 16, 16))
    model, x = model.eval().cuda().to(dtype), x.cuda().to(dtype)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        want, got = model(x), fn(x)
    tol = 5e-3 if dtype == torch.float32 else 3e-2  # float32: cuDNN's TF32, on weights with the batch norm folded in
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert "addmm" not in kernels_called(fn)
    assert any(n.endswith("_bias") for k in fn.artifact.fused for n in k.nodes)  # type: ignore[attr-defined]
