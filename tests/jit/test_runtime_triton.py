"""User Triton kernels inside captured graphs (wrap_triton, triton_op, triton.autotune) run through
opgen's JIT launcher: from opgen.compile and the torch.compile backend, in plain and CUDA-graph mode."""

from __future__ import annotations

import warnings

import pytest
import torch

import opgen
import opgen.jit

pytestmark = pytest.mark.skipif(not opgen.jit.available(), reason="; ".join(opgen.jit.missing()) or "-")
triton = pytest.importorskip("triton")
import kernels_for_tests as K  # noqa: E402
from torch.library import triton_op, wrap_triton  # noqa: E402

from opgen.runtime.pipeline import default_pipeline  # noqa: E402


def unfused() -> tuple[str, ...]:
    """The default passes less fusion: these tests count the user's kernels and choices alone."""
    return tuple(p for p in default_pipeline() if p != "fusion")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "cache"))


class WrapTriton(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(K.axpy_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, 2.0, BLOCK=256)
        return (out.relu() + 1).sum(-1)


@triton_op("opgen_test::axpy", mutates_args={})
def axpy_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(K.axpy_kernel)[(triton.cdiv(n, 128),)](x, y, out, n, 0.5, BLOCK=128)
    return out


class TritonOp(torch.nn.Module):
    def forward(self, x, y):
        return axpy_op(x * 2, y).tanh()


class Tuned(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(K.tuned_mul_kernel)[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
        return out - x


class InPlace(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        wrap_triton(K.scale_inplace_kernel)[(triton.cdiv(y.numel(), 512),)](y, y.numel(), 4.0, BLOCK=512)
        return y * 2


CASES = [
    (WrapTriton, lambda: (torch.randn(8, 300, device="cuda"), torch.randn(8, 300, device="cuda"))),
    (TritonOp, lambda: (torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda"))),
    (Tuned, lambda: (torch.randn(5000, device="cuda"),)),
    (InPlace, lambda: (torch.randn(4, 700, device="cuda"),)),
]


@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize(("model", "make"), CASES, ids=[c[0].__name__ for c in CASES])
def test_opgen_compile_launches_triton_kernels(model, make, cuda_graphs):
    m = model()
    inputs = make()
    expected = m(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = opgen.compile(m, inputs, fallback=False, cuda_graphs=cuda_graphs, passes=unfused())
        for _ in range(3):  # plain first call, capture, replays
            got = fn(*inputs)
            torch.testing.assert_close(got, expected)
    fresh = make()
    torch.testing.assert_close(fn(*fresh), m(*fresh))
    source = fn.artifact.source if hasattr(fn, "artifact") else ""
    assert "rt.jit[" in source, source
    report = str(fn.report())
    assert "Triton kernels and kernel choices through opgen's JIT: 1" in report, report
    assert "not called yet" not in report, report


@pytest.mark.parametrize(("model", "make"), CASES[:3], ids=[c[0].__name__ for c in CASES[:3]])
def test_backend_launches_triton_kernels(model, make):
    m = model()
    inputs = make()
    compiled = torch.compile(m, backend="opgen")
    torch.testing.assert_close(compiled(*inputs), m(*inputs))


def test_autotuned_kernel_reports_its_pick():
    m = Tuned()
    x = torch.randn(5000, device="cuda")
    fn = opgen.compile(m, (x,), passes=unfused())
    fn(x)
    report = str(fn.report())
    assert "2 config(s)" in report and "autotuned" in report, report


class Residual(torch.nn.Module):
    def forward(self, x, y):
        return (x + y).relu() + y


@pytest.mark.parametrize("force", [None, "triton_add", "add"])
def test_kernel_choice_between_aten_and_triton(force, monkeypatch):
    from opgen.jit.cache import STATS

    if force:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    STATS.reset()
    m = Residual()
    x, y = torch.randn(64, 1024, device="cuda"), torch.randn(64, 1024, device="cuda")
    passes = unfused()
    at = passes.index("memory")  # before memory planning turns adds into in-place ones
    fn = opgen.compile(m, (x, y), passes=(*passes[:at], "kernel_choice", *passes[at:]))
    torch.testing.assert_close(fn(x, y), m(x, y))
    torch.testing.assert_close(fn(x, y), m(x, y))
    report = str(fn.report())
    assert report.count("choice among add, triton_add") == 2, report
    if force:
        assert f"{force} (forced)" in report and STATS.choices == 0
    else:
        # The two adds have one target and one size: the second takes the first's pick.
        assert "fastest on the first call" in report and "pick from the cache" in report
        assert STATS.choices == 1 and STATS.choice_hits == 1
