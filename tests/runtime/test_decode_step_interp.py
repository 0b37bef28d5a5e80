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
    ("family", "batch", "dtype"),
    [("llama", 1, "float32"), ("llama", 3, "float32"), ("qwen2", 1, "float32"), ("phi3", 3, "float32"),
     ("gemma2", 1, "float32"), ("gemma2", 3, "float32"), ("olmo2", 3, "float32"), ("qwen3", 1, "float32"),
     ("qwen3", 3, "float16"),  # q/k norms per head: a row kernel of their own (`attention_rows` takes whole rows)
     ("olmo2", 1, "float16"),  # a half type: the casts pass moves its rotation's casts into the cat's operands
     ("gpt2", 1, "float32"), ("gpt2", 3, "float32"),  # gelu_new as c_fc's epilogue
     ("gemma", 1, "float32")],  # one key/value head: its repeat a view, no clone
)  # fmt: skip
def test_every_kernel_of_a_step_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                           request: pytest.FixtureRequest, family: str,
                                                           batch: int, dtype: str) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    from opgen.bench.llm_families import causal_lm, step
    from opgen.runtime.execution import fused as fused_module

    checks: list[str] = []
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == "float32" else {"atol": 2e-2, "rtol": 2e-2}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    torch.manual_seed(0)
    lm = causal_lm(family, "tiny", dtype=getattr(torch, dtype))
    eager, mine = step(lm, 32, batch), step(lm, 32, batch)  # each with cache buffers of its own
    with torch.no_grad():
        example = (torch.zeros(batch, 1, dtype=torch.long), torch.tensor([0]))
        fn = opgen.compile(mine, example, passes=DEFAULT_PIPELINE, cache=False)  # the GPU passes too
        attention = [line for line in fn.report().jit if "decode attention" in line]  # type: ignore[attr-defined]
        assert attention and all("storing the step's keys and values first" in a for a in attention), attention
        rotates = family != "gpt2"  # GPT-2 adds learned positions to its embeddings: no rotation in its layers
        assert all("its query and keys computed first" in a for a in attention) == rotates, attention
        normed = family == "olmo2"  # its q/k norms over the whole width: computed by the attention (`attention_rows`)
        assert all("the rows they read too" in a for a in attention) == normed, attention
        for pos in range(6):
            ids = torch.randint(1, 100, (batch, 1))
            want = eager(ids, torch.tensor([pos]))
            torch.testing.assert_close(fn(ids, torch.tensor([pos])), want, **tolerance)  # type: ignore[operator]
    products = "gemv" if batch == 1 else "gemm"  # GPT-2's one row has no kernel of pointwise groups left
    kinds = {"attention", products} if family == "gpt2" and batch == 1 else {"attention", "fused", products}
    assert {c.split("_")[0] for c in checks} >= kinds  # every kind of kernel ran, checked


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma", "gemma2", "phi3", "olmo2", "qwen3", "gpt2"])
def test_every_family_prints_its_kernels_in_bfloat16(monkeypatch: pytest.MonkeyPatch, family: str) -> None:
    """Each family's tiny step in bfloat16 with the whole pipeline as on CUDA: every kernel's source prints (the
    casts a half type brings reach the printers: OLMo-2's once did not), and the ATen side equals eager's."""
    from opgen.bench.llm_families import causal_lm, step
    from opgen.runtime.execution import fused as fused_module

    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    monkeypatch.setattr(fused_module, "bindings", lambda found: {s.local: (lambda aten: aten) for s in found})
    lm = causal_lm(family, "tiny", dtype=torch.bfloat16)
    eager, mine = step(lm, 32), step(lm, 32)
    with torch.no_grad():
        fn = opgen.compile(mine, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0])), passes=DEFAULT_PIPELINE,
                           cache=False)  # fmt: skip
        assert fn.artifact.fused and all(f.source for f in fn.artifact.fused)  # type: ignore[attr-defined]
        for pos in range(2):
            ids = torch.randint(1, 100, (1, 1))
            torch.testing.assert_close(fn(ids, torch.tensor([pos])), eager(ids, torch.tensor([pos])))  # type: ignore[operator]


@interpreter
@pytest.mark.parametrize("batch", [1, 3])
def test_a_padded_head_with_its_writes_and_rotations_matches_in_the_interpreter(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, batch: int
) -> None:
    """A Llama with heads of 24 (no power of two, as Phi-3's 96): the attention stores the step's key and value
    rows and computes its rotations with the padded lanes masked, and the next positions read them back."""
    if ran_in_fresh_interpreter(request):
        return
    import transformers

    from opgen.bench.llm_families import step
    from opgen.runtime.execution import fused as fused_module

    checks: list[str] = []
    tolerance = {"atol": 1e-4, "rtol": 1e-4}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    config = transformers.LlamaConfig(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                      intermediate_size=128, num_hidden_layers=2, vocab_size=256)  # fmt: skip
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(config).eval()
    lm.generation_config.cache_implementation = "static"
    eager, mine = step(lm, 32, batch), step(lm, 32, batch)
    with torch.no_grad():
        example = (torch.zeros(batch, 1, dtype=torch.long), torch.tensor([0]))
        fn = opgen.compile(mine, example, passes=DEFAULT_PIPELINE, cache=False)
        attention = [line for line in fn.report().jit if "decode attention" in line]  # type: ignore[attr-defined]
        assert len(attention) == 2 and all("storing the step's keys and values first" in a for a in attention)
        assert all("its query and keys computed first" in a for a in attention), attention
        for pos in range(5):
            ids = torch.randint(1, 100, (batch, 1))
            want = eager(ids, torch.tensor([pos]))
            torch.testing.assert_close(fn(ids, torch.tensor([pos])), want, **tolerance)  # type: ignore[operator]
    assert any(c.startswith("attention") for c in checks)
