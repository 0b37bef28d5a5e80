"""opgen's generation loop (opgen.generate) on tiny random transformers models, against eager generate().

Greedy tokens equal transformers' own for 64 tokens on several families, prompts of different lengths
decoded side by side (each row at its own position) equal each prompt decoded alone, a seed gives the
same samples twice, stop tokens end rows, tokens stream in order, no prompt length recompiles the
prefill, and bad input is a GenerationError before any work.
"""

from __future__ import annotations

import pytest
import torch

from opgen.bench.llm_families import causal_lm
from opgen.generate import GenerationError, Generator, Sampling, StepTokens, generate

pytest.importorskip("transformers")

PROMPTS = [[1, 5, 7, 9, 11, 3, 4], [3, 4, 8, 2, 6], [9]]
CACHE = 96


@pytest.fixture(scope="module")
def llama() -> Generator:
    return Generator(causal_lm("llama"), max_cache=CACHE)


def eager_tokens(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, disable_compile=True,
                         eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "mistral", "phi3", "gpt2"])
def test_greedy_tokens_equal_eager_generate_for_64_tokens_on_each_family(family: str) -> None:
    model = causal_lm(family)
    gen = Generator(model, max_cache=CACHE)
    out = gen(PROMPTS, 64, stop_tokens=())
    with torch.no_grad():
        assert out.tokens == [eager_tokens(model, p, 64) for p in PROMPTS]
    assert out.steps == 63 and out.prefill_s > 0 and out.decode_s > 0


def test_the_eager_compiler_runs_the_same_loop(llama: Generator) -> None:
    eager = Generator(llama.model, max_cache=CACHE, compiler="eager")
    assert eager(PROMPTS, 12, stop_tokens=()).tokens == llama(PROMPTS, 12, stop_tokens=()).tokens


def test_a_prompt_decodes_the_same_alone_and_in_a_ragged_batch(llama: Generator) -> None:
    batch = llama(PROMPTS, 16, stop_tokens=()).tokens
    assert [llama([p], 16, stop_tokens=()).tokens[0] for p in PROMPTS] == batch


def test_a_seed_gives_the_same_samples_twice_and_another_seed_other_samples(llama: Generator) -> None:
    def sample(seed: int) -> list[list[int]]:
        return llama(PROMPTS, 24, Sampling(temperature=1.0, top_k=40, top_p=0.95, seed=seed), stop_tokens=()).tokens

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first
    assert first != llama(PROMPTS, 24, stop_tokens=()).tokens  # sampling, not greedy


def test_top_k_1_is_greedy_at_any_temperature(llama: Generator) -> None:
    greedy = llama(PROMPTS, 12, stop_tokens=()).tokens
    assert llama(PROMPTS, 12, Sampling(temperature=2.0, top_k=1, seed=0), stop_tokens=()).tokens == greedy


def test_a_tiny_top_p_keeps_only_the_most_likely_token(llama: Generator) -> None:
    greedy = llama(PROMPTS, 12, stop_tokens=()).tokens
    assert llama(PROMPTS, 12, Sampling(temperature=1.0, top_p=1e-6, seed=0), stop_tokens=()).tokens == greedy


def test_sampling_follows_the_distribution() -> None:
    """The exponential race picks each token with its probability: 4000 draws from known logits."""
    from opgen.generate.sampling import Sampler

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    sampler = Sampler(Sampling(temperature=1.0, seed=0), torch.device("cpu"))
    draws = torch.cat([sampler(probs.log().expand(1000, 4)) for _ in range(4)])
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_stop_tokens_end_each_row_at_its_own_step(llama: Generator) -> None:
    free = llama(PROMPTS, 20, stop_tokens=()).tokens
    stop = free[0][3]  # row 0 stops at its 4th token; the others at their first such token, if any
    out = llama(PROMPTS, 20, stop_tokens=[stop])
    for row, tokens in zip(free, out.tokens, strict=True):
        end = tokens.index(stop) + 1 if stop in tokens else len(tokens)
        assert tokens == row[:end]
        assert stop not in row[: end - 1]
    assert out.tokens[0] == free[0][:4]


def test_the_loop_stops_early_once_every_row_has_stopped(llama: Generator) -> None:
    first = llama([PROMPTS[0]], 1, stop_tokens=()).tokens[0][0]
    out = llama([PROMPTS[0]], 60, stop_tokens=[first])
    assert out.tokens == [[first]]
    assert out.steps <= 16  # the host sees the stop within the landing's depth of steps


def test_the_model_eos_is_the_default_stop_token(llama: Generator) -> None:
    first = llama([PROMPTS[1]], 1, stop_tokens=()).tokens[0][0]
    model = causal_lm("llama")
    model.generation_config.eos_token_id = [first]
    assert generate(model, [PROMPTS[1]], 30, max_cache=CACHE).tokens == [[first]]


def test_tokens_stream_step_by_step_and_add_up_to_the_result(llama: Generator) -> None:
    seen: list[StepTokens] = []
    out = llama(PROMPTS, 10, stop_tokens=(), on_tokens=seen.append)
    assert [s.step for s in seen] == list(range(10))
    assert [[s.tokens[r] for s in seen] for r in range(3)] == out.tokens
    streamed = list(llama.stream(PROMPTS, 10, stop_tokens=()))
    assert streamed == seen


def test_a_stopped_row_streams_none(llama: Generator) -> None:
    free = llama(PROMPTS, 8, stop_tokens=()).tokens
    stop = free[0][1]
    steps = list(llama.stream(PROMPTS, 8, stop_tokens=[stop]))
    row0 = [s.tokens[0] for s in steps]
    assert row0[:2] == free[0][:2] and all(t is None for t in row0[2:])


def test_no_prompt_length_recompiles_the_prefill() -> None:
    gen = Generator(causal_lm("qwen2"), max_cache=40)
    for length in range(1, 40):
        gen([[(7 * i) % 256 for i in range(length)]], 1, stop_tokens=())
    steps = gen.steps(1)
    assert steps.prefill.report().specializations == 1  # one function (recompile=False raises otherwise)
    assert steps.decode.report().specializations == 1


def test_prompts_run_as_whole_chunks_and_give_the_tokens_of_the_dynamic_prefill(llama: Generator) -> None:
    """prefill_chunk=8: prompts of 1..17 tokens (a ragged batch) left-padded to whole chunks of 8 give the tokens
    of the dynamic prefill; one that would not fit the cache padded (93 + 3 of 96) runs the dynamic prefill."""
    chunked = Generator(llama.model, max_cache=CACHE, prefill_chunk=8)
    steps = chunked.steps(3)
    assert steps.chunk_size == 8 and steps.prompt.padded(5, 4, CACHE) == 8 and steps.prompt.padded(17, 4, CACHE) == 24
    assert steps.prompt.padded(93, 3, CACHE) == 93  # 96 + 3 positions: not whole chunks
    prompts = [[(5 * i + 1) % 256 for i in range(n)] for n in (1, 8, 17)]
    assert chunked(prompts, 12, stop_tokens=()).tokens == llama(prompts, 12, stop_tokens=()).tokens
    long = [[(3 * i + 2) % 256 for i in range(93)]]
    assert chunked(long, 3, stop_tokens=()).tokens == llama(long, 3, stop_tokens=()).tokens
    assert steps.chunk is not None and steps.chunk.report().specializations == 1  # one graph for every prompt
    with torch.no_grad():
        assert chunked([prompts[2]], 12, stop_tokens=()).tokens[0] == eager_tokens(llama.model, prompts[2], 12)
    with pytest.raises(GenerationError, match="prefill_chunk must be an int"):
        Generator(llama.model, max_cache=CACHE, prefill_chunk=CACHE + 1)
    with pytest.raises(GenerationError, match="prefill_chunk is opgen's"):
        Generator(llama.model, max_cache=CACHE, compiler="eager", prefill_chunk=8)


@pytest.mark.parametrize(
    ("prompts", "new", "match"),
    [
        ([], 4, "no prompts"),
        ([[1, 2], []], 4, "prompt 1 is empty"),
        ([list(range(1, 90))], 10, "needs 99 cache positions; the cache has 96"),
        ([[1, 2, 300]], 4, r"token ids are ints in \[0, 256\)"),
        ([[1, 2.5]], 4, "token ids are ints"),
        ("hello", 4, "prompts must be token ids"),
        (torch.ones(2, 3), 4, "integer token ids"),
        ([[1, 2]], 0, "max_new_tokens must be an int >= 1"),
    ],
)
def test_bad_input_is_a_clear_error(llama: Generator, prompts: object, new: int, match: str) -> None:
    with pytest.raises(GenerationError, match=match):
        llama(prompts, new)


def test_bad_settings_are_clear_errors(llama: Generator) -> None:
    with pytest.raises(GenerationError, match="temperature"):
        Sampling(temperature=-1.0)
    with pytest.raises(GenerationError, match="top_p"):
        Sampling(temperature=1.0, top_p=0.0)
    with pytest.raises(GenerationError, match="top_k"):
        Sampling(top_k=-2)
    with pytest.raises(GenerationError, match="stop_tokens"):
        llama(PROMPTS, 4, stop_tokens=[-1])
    with pytest.raises(GenerationError, match="compiler"):
        Generator(llama.model, compiler="tvm")


def test_a_model_without_cache_support_is_a_clear_error() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100)  # fmt: skip
    with pytest.raises(GenerationError, match="BertModel"):
        Generator(transformers.BertModel(config))
    with pytest.raises(GenerationError, match="Linear is not a transformers causal LM"):
        Generator(torch.nn.Linear(2, 2))
