"""Every LLM family of `opgen.bench.llm_families`, tiny and in float32, decoding through a static cache:
opgen's step gives eager's logits at every position (teacher-forced: both read the same tokens), and
greedy decoding gives eager's tokens, on both backends. The decode and generation work builds on this."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import opgen
from opgen.bench.llm_families import FAMILIES, causal_lm, step

PROMPT = [1, 5, 7, 9, 11, 3]
NEW_TOKENS = 10
CACHE = 32


def _greedy(fn, prompt: list[int], new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Tokens and every step's logits; the prompt is fed one token at a time (teacher forcing)."""
    tokens, logits = list(prompt), []
    for pos in range(len(prompt) + new_tokens - 1):
        out = fn(torch.tensor([[tokens[pos]]]), torch.tensor([pos]))
        logits.append(out[0, -1].clone())
        if pos >= len(prompt) - 1:
            tokens.append(int(out[0, -1].argmax()))
    return tokens, logits


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_decodes_as_eager(family: str, backend: str) -> None:
    model = causal_lm(family, "tiny")
    eager, compiled_step = step(model, CACHE), step(model, CACHE)  # each with cache buffers of its own
    with torch.no_grad():
        fast = opgen.compile(compiled_step, (torch.tensor([[1]]), torch.tensor([0])), backend=backend)
        tokens, logits = _greedy(eager, PROMPT, NEW_TOKENS)
        fast_tokens, fast_logits = _greedy(fast, PROMPT, NEW_TOKENS)
    assert fast_tokens == tokens
    worst = max(float((a - b).abs().max()) for a, b in zip(fast_logits, logits, strict=True))
    assert worst < 1e-4, worst
    assert "fallback to the ATen op:   0" in str(fast.report())


def test_the_table_names_real_shapes_and_rejects_unknown_names() -> None:
    assert set(FAMILIES) >= {"llama", "qwen2", "mistral", "gemma", "gemma2", "phi3", "olmo2", "gpt2"}
    assert all(f.real and f.checkpoint for f in FAMILIES.values())
    with pytest.raises(ValueError, match="unknown family 'falcon'"):
        causal_lm("falcon")
    with pytest.raises(ValueError, match="size 'huge'"):
        FAMILIES["llama"].config_fields("huge")
