"""The model zoo (opgen/bench/zoo_models.py): each architecture compiles strictly and matches eager.

Needs the `zoo` extra (`pip install -e .[zoo]`, bringing `transformers`); skipped without it.
Models are built from small configs with random weights: nothing is downloaded. CI runs the
`CI_MODELS` subset (one per family, about a minute); `OPGEN_ZOO=all` runs every model.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")

import opgen
from opgen.bench.zoo_models import BY_NAME, ZOO

CI_MODELS = ("bert", "llama", "t5", "vit", "mobilenet_v2", "resnet")
SELECTED = [m.name for m in ZOO] if os.environ.get("OPGEN_ZOO") == "all" else list(CI_MODELS)


@pytest.mark.parametrize("backend", ["python", "cpp"])  # the generated Python, the C++ executor
@pytest.mark.parametrize("name", SELECTED)
def test_zoo_model_compiles_strictly_and_matches_eager(name: str, backend: str) -> None:
    model, inputs = BY_NAME[name].build()
    with torch.no_grad():
        expected = model(*inputs)
        compiled = opgen.compile(model, inputs, fallback=False, backend=backend)
        actual = compiled(*inputs)
    report = compiled.report()
    assert report.fallbacks == () and report.direct > 0, str(report)
    assert backend == "python" or type(compiled).__name__ == "CppFunction", str(report)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_zoo_has_the_promised_families() -> None:
    families = {m.family for m in ZOO}
    assert len(ZOO) >= 15
    assert {"encoder", "decoder", "encoder-decoder", "vision-transformer", "cnn", "mobile-cnn"} <= families


def test_attention_lowers_to_the_fused_kernel() -> None:
    """BERT's and ViT's attention stays one scaled_dot_product_attention call per layer (2 layers)."""
    for name in ("bert", "vit"):
        model, inputs = BY_NAME[name].build()
        with torch.no_grad():
            compiled = opgen.compile(model, inputs)
            expected, actual = model(*inputs), compiled(*inputs)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        source = compiled.artifact.source
        plain = source[: source.index("def forward_profiled")]  # the profiled twin repeats every call
        calls = [line for line in plain.splitlines() if " scaled_dot_product_attention(" in line]
        assert "= kernel_ops.scaled_dot_product_attention\n" in source and len(calls) == 2, f"{name}: {calls}"
        assert "_softmax" not in source, f"{name}: a softmax is left in the generated code"


def _jit_ready() -> bool:
    from opgen.jit.env import available

    return torch.cuda.is_available() and bool(available())


@pytest.mark.skipif(not _jit_ready(), reason="needs a CUDA GPU, a CUDA build of opgen and triton")
@pytest.mark.usefixtures("cudnn_exact")
@pytest.mark.parametrize("name", [m.name for m in ZOO])
def test_zoo_model_on_cuda_with_fusion(name: str) -> None:
    """Every zoo model on the GPU through the default pipeline (fusion included) matches eager, with the
    fused kernels forced where the first call would pick; report() lists each fused group."""
    model, inputs = BY_NAME[name].build()
    model, inputs = model.cuda(), tuple(t.cuda() for t in inputs)
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPGEN_FORCE_KERNEL", "triton")
        expected = model(*inputs)
        compiled = opgen.compile(model, inputs, fallback=False)
        actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    report = str(compiled.report())
    fused = [line.strip() for line in report.splitlines() if line.strip().startswith("fused ")]  # fused0, mean0, ...
    print(f"{name}: {len(fused)} fused kernels")
    assert all(line.endswith(": triton (forced)") for line in fused), report
