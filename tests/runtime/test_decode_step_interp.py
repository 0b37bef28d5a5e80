"""A transformers family's decode step (tiny, float32) with the whole default pipeline run as on CUDA: every
generated kernel (products, norms, the attention with its rotations and cache writes, ...) runs in
Triton's interpreter, each config checked against its ATen calls, and the step's logits equal eager's
at every position. The kernels that write the cache write it where the next steps read it, so a wrong
store shows in the later positions' logits."""

from __future__ import annotations

import pytest
import torch
from fusion_interp import InterpretedBinding, ran_in_fresh_interpreter, run_passes_as_if_cuda
from test_decode_attention import interpreter

import opgen
from opgen.runtime import pipeline
from opgen.runtime.passes import DEFAULT_PIPELINE

pytest.importorskip("transformers")


@interpreter
@pytest.mark.parametrize(
    ("family", "batch"),
    [("llama", 1), ("llama", 3), ("qwen2", 1), ("phi3", 3), ("gemma2", 1), ("gemma2", 3), ("olmo2", 3)],
)
def test_every_kernel_of_a_step_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                           request: pytest.FixtureRequest, family: str,
                                                           batch: int) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    from opgen.bench.llm_families import causal_lm, step
    from opgen.runtime.execution import fused as fused_module

    checks: list[str] = []
    tolerance = {"atol": 1e-4, "rtol": 1e-4}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    torch.manual_seed(0)
    lm = causal_lm(family, "tiny")
    eager, mine = step(lm, 32, batch), step(lm, 32, batch)  # each with cache buffers of its own
    with torch.no_grad():
        example = (torch.zeros(batch, 1, dtype=torch.long), torch.tensor([0]))
        fn = opgen.compile(mine, example, passes=DEFAULT_PIPELINE, cache=False)  # the GPU passes too
        attention = [line for line in fn.report().jit if "decode attention" in line]  # type: ignore[attr-defined]
        assert attention and all("storing the step's keys and values first" in a for a in attention), attention
        assert all("its query and keys computed first" in a for a in attention), attention
        for pos in range(6):
            ids = torch.randint(1, 100, (batch, 1))
            want = eager(ids, torch.tensor([pos]))
            torch.testing.assert_close(fn(ids, torch.tensor([pos])), want, atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert {c.split("_")[0] for c in checks} >= {"attention", "fused"}  # every kind of kernel ran, checked
