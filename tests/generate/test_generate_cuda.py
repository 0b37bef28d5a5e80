"""opgen's generation loop on a GPU: decode steps replayed as CUDA graphs, tokens landing through events.

float32: greedy tokens equal eager generate()'s for 64 tokens (Llama, Qwen2, Gemma), the prompts run as a
chunk replayed as a CUDA graph; ragged batches equal each prompt alone. A seed repeats and a stop token
ends the loop early (there the dynamic prefill runs). bf16: teacher-forced logits stay within the error
Inductor's loop shows on the same model.
"""

from __future__ import annotations

import pytest
import torch

from opgen.bench.llm_families import causal_lm
from opgen.generate import Generator, Sampling

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[1, 5, 7, 9, 11, 3, 4], [3, 4, 8, 2, 6], [9]]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_greedy_tokens_equal_eager_generate_on_the_gpu(family: str) -> None:
    model = causal_lm(family, device="cuda")
    gen = Generator(model, max_cache=96, prefill_chunk=16)  # prompts as one chunk of 16, replayed as a CUDA graph
    assert gen.cuda_graphs
    out = gen(PROMPTS, 64, stop_tokens=())
    assert "captured" in str(gen.steps(3).chunk.report().cuda_graph)  # type: ignore[union-attr]
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, out.tokens, strict=True):
            ref = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=64, do_sample=False,
                                 disable_compile=True, eos_token_id=None, pad_token_id=0)  # fmt: skip
            assert tokens == ref[0, len(prompt) :].tolist()
    assert [gen([p], 16, stop_tokens=()).tokens[0] for p in PROMPTS] == [t[:16] for t in out.tokens]


def test_sampling_repeats_with_a_seed_and_stop_tokens_end_the_loop_on_the_gpu() -> None:
    gen = Generator(causal_lm("llama", device="cuda"), max_cache=96)
    sampling = Sampling(temperature=1.0, top_k=50, top_p=0.9, seed=5)
    first = gen(PROMPTS, 32, sampling, stop_tokens=()).tokens
    assert gen(PROMPTS, 32, sampling, stop_tokens=()).tokens == first
    stop = first[0][2]
    out = gen([PROMPTS[0]], 80, sampling, stop_tokens=[stop])
    assert out.tokens == [first[0][:3]]
    assert out.steps <= 2 + 16  # the host saw the stop within the landing's depth


def test_bf16_logits_stay_within_inductors_error() -> None:
    from opgen.bench.generate import forced_logits

    model = causal_lm("llama", device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]], device="cuda")
    eager = Generator(model, max_cache=64, compiler="eager")
    tokens = eager(ids, 24, stop_tokens=()).tokens
    with torch.no_grad():
        want = forced_logits(eager.steps(2), ids, tokens)
    scale = max(float(w.abs().max()) for w in want)

    def err(compiler: str) -> float:
        with torch.no_grad():
            got = forced_logits(Generator(model, max_cache=64, compiler=compiler).steps(2), ids, tokens)
        return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) / scale

    torch._dynamo.reset()
    mine, inductors = err("opgen"), err("inductor")
    assert mine <= max(2 * inductors, 1e-2), (mine, inductors)
