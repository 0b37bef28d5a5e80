"""transformers' generate() through the torch.compile backend (`model.forward` compiled), as its docs
show it: a static cache, greedy, prompts of several lengths, tokens equal to eager's, per family.

A prompt of another length recompiles with symbolic sizes, where Dynamo passes the prompt's length
twice (as `input_ids`'s size and as `cache_position`'s): the generated function once named both
arguments after the symbol, a SyntaxError ('duplicate argument s27') at the third generate().
"""

from __future__ import annotations

import pytest
import torch

from opgen.bench.llm_families import causal_lm  # imports transformers only when it builds a model

pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "phi3"])
def test_generate_with_prompts_of_several_lengths_gives_eager_tokens(family: str) -> None:
    model = causal_lm(family, "tiny")
    settings = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static", "disable_compile": True}
    prompts = [torch.tensor([[1, 5, 7, 9]]), torch.tensor([[3, 4]]), torch.tensor([[8, 2, 6, 1, 5, 3, 7]])]
    torch._dynamo.reset()
    with torch.no_grad():
        expected = [model.generate(p, **settings).tolist() for p in prompts]
        model.forward = torch.compile(model.forward, backend="opgen")
        assert [model.generate(p, **settings).tolist() for p in prompts] == expected
