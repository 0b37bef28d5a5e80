"""The fusion pass on a GPU: each fusible pattern matches eager with the Triton kernel forced, with
the ATen calls forced, and as the first call picks; aliasing and in-place graphs; a kernel that
fails to compile; CUDA-graph mode; the disk cache. Skipped without a GPU and opgen's JIT.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from test_fusion import CASES, EXPECTED_KERNELS, BiasGelu, HalfChain, MaskedSoftmax, PermutedCopy, ResidualNorm

import opgen
from opgen.runtime.errors import OpgenWarning


def _jit_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    from opgen.jit.env import available

    return bool(available())


pytestmark = [
    pytest.mark.skipif(not _jit_ready(), reason="needs a CUDA GPU, a CUDA build of opgen and triton"),
    pytest.mark.usefixtures("cudnn_exact"),
]

TOLERANCE = {
    "float32": {"atol": 1e-5, "rtol": 1e-5},
    "float16": {"atol": 2e-3, "rtol": 2e-3},
    "bfloat16": {"atol": 2e-2, "rtol": 2e-2},
}  # fmt: skip  (Inductor's own test tolerances)


def _tolerance(*tensors: torch.Tensor) -> dict[str, float]:
    """The loosest of the dtypes involved: a float32 result computed from half inputs is as exact as half."""
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()]
    return max((TOLERANCE.get(d, TOLERANCE["float32"]) for d in dtypes), key=lambda t: t["atol"])


def _outputs(value: Any) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _check(name: str, force: str | None, monkeypatch: pytest.MonkeyPatch, cuda_graphs: bool = False) -> Any:
    if force is not None:
        monkeypatch.setenv("OPGEN_FORCE_KERNEL", force)
    make_model, make_inputs = CASES[name]
    model = make_model().cuda()
    eager = copy.deepcopy(model)
    with torch.no_grad():
        inputs = tuple(t.cuda() for t in make_inputs())
        compiled = opgen.compile(model, inputs, cuda_graphs=cuda_graphs)
        for _ in range(3):
            inputs = tuple(t.cuda() for t in make_inputs())
            got, expected = compiled(*inputs), eager(*inputs)
            for g, e in zip(_outputs(got), _outputs(expected), strict=True):
                torch.testing.assert_close(g, e, equal_nan=True, **_tolerance(*inputs, e))
    report = str(compiled.report())
    # the `horizontal` pass runs the two rotations in one launch, and the three independent row kernels in another;
    # a pointwise kernel after a product kernel is that kernel's last step (`gemv_epilogue`: bias_gelu's)
    launches = {**EXPECTED_KERNELS, "rotary_pairs": 1, "row_reductions": 1}
    groups = report.count("fused fused") + report.count("ending with its pointwise kernel")
    assert groups == launches[name], report
    return compiled


@pytest.mark.parametrize("force", ["triton", "aten", None])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_patterns_match_eager(name: str, force: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _check(name, force, monkeypatch)
    report = str(compiled.report())
    if force is not None:
        assert f": {force} (forced)" in report
    else:
        assert "fastest on the first call" in report or "pick from the cache" in report


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("model", [ResidualNorm, BiasGelu, MaskedSoftmax, PermutedCopy], ids=lambda m: m.__name__)
def test_low_precision_row_and_pointwise_kernels(
    model: Any, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    torch.manual_seed(0)  # one set of inputs: ResidualNorm's `x + 2 * norm(x)` cancels, so its error varies with them
    m = model().cuda().to(dtype) if model not in (MaskedSoftmax, PermutedCopy) else model()
    inputs = {
        ResidualNorm: lambda: (torch.randn(4, 9, 48), torch.randn(4, 9, 48)),
        BiasGelu: lambda: (torch.randn(3, 7, 32),),
        MaskedSoftmax: lambda: (torch.randn(2, 4, 17, 17), torch.tril(torch.ones(17, 17, dtype=torch.bool))),
        PermutedCopy: lambda: (torch.randn(2, 49, 3, 6, 32), torch.randn(32, 32)),
    }[model]()
    inputs = tuple(t.cuda().to(dtype) if t.is_floating_point() else t.cuda() for t in inputs)
    with torch.no_grad():
        compiled = opgen.compile(m, inputs)
        tolerance = TOLERANCE[str(dtype).removeprefix("torch.")]
        if dtype == torch.float16:  # outputs up to 8: one half-precision step there is 4e-3 (ATen rounds the sum)
            tolerance = {**tolerance, "atol": 4e-3}
        torch.testing.assert_close(compiled(*inputs), m(*inputs), **tolerance)
    assert "triton (forced)" in str(compiled.report())


def test_half_chain_casts_round_like_aten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    model = HalfChain()
    x, y = torch.rand(64, 129, device="cuda").half(), torch.rand(64, 129, device="cuda").half()
    with torch.no_grad():
        compiled = opgen.compile(model, (x, y))
        for got, want in zip(compiled(x, y), model(x, y), strict=True):
            assert got.dtype == want.dtype and got.stride() == want.stride()
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_graph_mode_replays_fused_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("residual_norm", "masked_softmax", "chain"):
        _check(name, "triton", monkeypatch, cuda_graphs=True)


def test_a_kernel_that_fails_to_compile_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from opgen.runtime.codegen.triton import groups as backend

    original = backend.program_elements

    def broken(group: Any, *pid: str) -> list[str]:
        return [*original(group, *pid), "tl.static_assert(False, 'a kernel made to fail')"]

    monkeypatch.setattr(backend, "program_elements", broken)
    model = ResidualNorm().cuda()
    inputs = (torch.randn(3, 7, 48, device="cuda"), torch.randn(3, 7, 48, device="cuda"))
    with torch.no_grad():
        # The kernel compiles in the background from load on: the failure may surface while the
        # model loads or at the first call; either way one warning, and the ATen calls run.
        with pytest.warns(OpgenWarning, match="candidate 'triton' failed"):
            compiled = opgen.compile(model, inputs, cache=False)
            got = compiled(*inputs)
        torch.testing.assert_close(got, model(*inputs))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(compiled(*inputs), model(*inputs))  # once: no second warning
    assert "aten" in str(compiled.report())


def test_fused_graphs_come_back_from_the_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    model = MaskedSoftmax()
    inputs = (torch.randn(2, 3, 9, 9, device="cuda"), torch.tril(torch.ones(9, 9, dtype=torch.bool, device="cuda")))
    with torch.no_grad():
        first = opgen.compile(model, inputs)
        first(*inputs)
        again = opgen.compile(model, inputs)
        torch.testing.assert_close(again(*inputs), model(*inputs))
    assert "loaded from the disk cache" in str(again.report()) and "triton (forced)" in str(again.report())


def test_fusion_is_optional() -> None:
    from opgen.runtime.pipeline import default_pipeline

    assert "fusion" in default_pipeline()
    make_model, make_inputs = CASES["residual_norm"]
    model = make_model().cuda()
    inputs = tuple(t.cuda() for t in make_inputs())
    with torch.no_grad():
        compiled = opgen.compile(model, inputs, passes=[p for p in default_pipeline() if p != "fusion"])
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    report = str(compiled.report())
    assert "fused fused" not in report  # no fusion group (the gemv pass's `gemv` kernels remain)
