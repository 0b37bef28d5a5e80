"""Means over H and W of channels-last tensors as generated Triton kernels (passes.fusion.spatial_mean).

On the CPU the program is relabelled as CUDA around the pass; kernels are bound to their ATen call, or
where triton is installed and there is no GPU, run in Triton's interpreter with every config and
checked against it. With a GPU they run for real.
"""

from __future__ import annotations

import pytest
import torch
from fusion_interp import CPU_PASSES, compile_with_pass, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.passes.fusion.spatial_mean import spatial_means

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CL = torch.channels_last


class Mean(nn.Module):
    def __init__(self, dims: tuple[int, ...] = (2, 3), keepdim: bool = True) -> None:
        super().__init__()
        self.dims, self.keepdim = dims, keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(self.dims, keepdim=self.keepdim)
        return torch.sigmoid(m) * x if self.keepdim else m  # a squeeze-excitation's shape


def compiled(monkeypatch, model: nn.Module, x: torch.Tensor, checks: list[str] | None = None):  # type: ignore[no-untyped-def]
    tolerance = {"rtol": 2e-3, "atol": 2e-3} if x.dtype == torch.float16 else None
    return compile_with_pass(monkeypatch, model.eval(), (x,), "spatial_mean", spatial_means, checks, tolerance,
                             leave_out=CPU_PASSES)  # fmt: skip


def means(kernels) -> list:  # type: ignore[no-untyped-def]
    return [k for k in kernels if k.name.startswith("mean_")]


@pytest.mark.parametrize("shape", [(2, 24, 7, 9), (1, 200, 3, 3), (3, 5, 20, 20)], ids=str)
def test_a_channels_last_mean_becomes_a_kernel(monkeypatch, shape) -> None:
    x = torch.randn(shape).to(memory_format=CL)
    fn, kernels = compiled(monkeypatch, Mean(), x)
    (kernel,) = means(kernels)
    assert kernel.describe.startswith("channels-last mean") and len(kernel.configs) >= 1
    with torch.no_grad():
        torch.testing.assert_close(fn(x), Mean()(x))


def test_after_fusion_each_kernel_has_its_own_local(monkeypatch) -> None:
    """The mean's kernel and the fused sigmoid * x kernel in one program (their locals once collided)."""
    from opgen.runtime.passes.fusion.rewrite import fuse

    x = torch.randn(2, 8, 5, 5).to(memory_format=CL)
    both = compile_with_pass(monkeypatch, Mean().eval(), (x,), "fusion", lambda p, r: spatial_means(fuse(p, r), r),
                             leave_out=CPU_PASSES)  # fmt: skip
    fn, kernels = both
    assert len({k.local for k in kernels}) == len(kernels) == 2 and means(kernels)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), Mean()(x))


@pytest.mark.parametrize(
    ("model", "layout"),
    [(Mean(), torch.contiguous_format), (Mean(keepdim=False), CL), (Mean((1,)), CL), (Mean((1, 2)), CL)],
    ids=["nchw", "no_keepdim", "channels", "c_and_h"],
)
def test_other_means_stay_aten(monkeypatch, model, layout) -> None:
    x = torch.randn(2, 8, 5, 5).to(memory_format=layout)
    fn, kernels = compiled(monkeypatch, model, x)
    assert not means(kernels)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(2, 24, 7, 9), (3, 130, 11, 11)], ids=str)
def test_the_kernel_runs_in_the_interpreter(monkeypatch, request, dtype, shape) -> None:
    if ran_in_fresh_interpreter(request):
        return
    x = torch.randn(shape).to(memory_format=CL).to(dtype)
    checks: list[str] = []
    fn, kernels = compiled(monkeypatch, Mean(), x, checks)
    with torch.no_grad():
        fn(x)  # each config checked against ATen's mean as it runs
    assert means(kernels) and any(c.startswith("mean_") for c in checks)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_on_the_gpu_the_mean_matches_eager(dtype) -> None:
    x = torch.randn(4, 96, 28, 28, device="cuda", dtype=dtype).to(memory_format=CL)
    model = Mean()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        got, want = fn(x), model(x)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert means(fn.artifact.fused)  # type: ignore[attr-defined]
