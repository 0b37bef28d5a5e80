"""transformers' generate() through the torch.compile backend (`model.forward` compiled), as its docs
show it: a static cache, greedy, prompts of several lengths, tokens equal to eager's, per family.

A prompt of another length recompiles with symbolic sizes, where Dynamo passes the prompt's length
twice (as `input_ids`'s size and as `cache_position`'s): the generated function once named both
arguments after the symbol, a SyntaxError ('duplicate argument s27') at the third generate().
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_prompts_of_several_lengths_gives_eager_tokens(family: str) -> None:
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                                max_position_embeddings=64, **extra)  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    settings = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static", "disable_compile": True}
    prompts = [torch.tensor([[1, 5, 7, 9]]), torch.tensor([[3, 4]]), torch.tensor([[8, 2, 6, 1, 5, 3, 7]])]
    torch._dynamo.reset()
    with torch.no_grad():
        expected = [model.generate(p, **settings).tolist() for p in prompts]
        model.forward = torch.compile(model.forward, backend="opgen")
        assert [model.generate(p, **settings).tolist() for p in prompts] == expected
