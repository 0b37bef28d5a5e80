"""The LLM families users bring, as transformers configs: real checkpoints' shapes, and tiny ones for tests.

Each family names its transformers config and causal-LM classes and two sets of config fields:
`real`, the widths of a published checkpoint (random weights: nothing is downloaded), and `tiny`,
the same code path at test size. `step(family, size, max_cache)` builds one decode step, (token ids,
cache position) -> logits, in transformers' static-cache export wrapper, whose cache buffers each
call writes in place. Needs transformers (the zoo extra).

`tests/zoo/test_decode_families.py` decodes every family here on both backends against eager, so a
family added to the table is checked from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    config: str  # transformers' config class
    model: str  # its causal-LM class
    checkpoint: str  # whose widths `real` copies
    real: dict[str, Any]
    tiny: dict[str, Any] = field(default_factory=dict)  # over TINY
    own_names: bool = False  # its config names its widths its own way (GPT-2): `tiny` alone, not over TINY

    def widths(self, size: str) -> str:
        """How a report names the widths: the checkpoint's ("Llama-3.2-1B widths"), or "tiny widths"."""
        if size != "real":
            return f"{size} widths"
        return self.checkpoint if self.checkpoint.endswith("widths") else f"{self.checkpoint} widths"

    def config_fields(self, size: str) -> dict[str, Any]:
        if size not in ("tiny", "real"):
            raise ValueError(f"size {size!r}: 'tiny' or 'real'")
        if size == "real":
            return dict(self.real)
        return dict(self.tiny) if self.own_names else {**TINY, **self.tiny}


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", "LlamaConfig", "LlamaForCausalLM", "Llama-3.2-1B",
               {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0, "tie_word_embeddings": True}),
        Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", "Qwen2.5-0.5B",
               {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151936, "rope_theta": 1000000.0, "tie_word_embeddings": True}),
        Family("mistral", "MistralConfig", "MistralForCausalLM", "TinyLlama-1.1B widths",
               {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
                "num_key_value_heads": 4, "vocab_size": 32000, "tie_word_embeddings": False}),
        Family("gemma", "GemmaConfig", "GemmaForCausalLM", "Gemma-2B",
               {"hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18, "num_attention_heads": 8,
                "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000},
               {"head_dim": 16, "num_key_value_heads": 1}),  # multi-query, as the checkpoint
        Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM", "Gemma-2-2B",
               {"hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000},
               {"head_dim": 16}),
        Family("phi3", "Phi3Config", "Phi3ForCausalLM", "Phi-3-mini",
               {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 32, "vocab_size": 32064, "pad_token_id": 0},
               {"pad_token_id": 0}),
        Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "Qwen3-0.6B",
               {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000.0,
                "tie_word_embeddings": True},
               {"head_dim": 16}),
        Family("olmo2", "Olmo2Config", "Olmo2ForCausalLM", "OLMo-2-1B",
               {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
                "num_key_value_heads": 16, "vocab_size": 100352, "rope_theta": 500000.0}),
        Family("gpt2", "GPT2Config", "GPT2LMHeadModel", "GPT-2 (124M)",
               {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
               {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 128, "bos_token_id": 0,
                "eos_token_id": 1}, own_names=True),
    )
}  # fmt: skip


def causal_lm(family: str, size: str = "tiny", seed: int = 0, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32, layers: int | None = None) -> nn.Module:  # fmt: skip
    """The family's causal LM with random weights, in eval mode, its generation set to a static cache;
    `layers` decoder layers where given (the checkpoint's count otherwise)."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    entry = FAMILIES[family]
    fields = entry.config_fields(size)
    if layers is not None:
        fields["n_layer" if entry.own_names else "num_hidden_layers"] = layers
    config = getattr(transformers, entry.config)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, entry.model)(config).to(device=device, dtype=dtype).eval()
    model.generation_config.cache_implementation = "static"
    return model  # type: ignore[no-any-return]


def step(model: nn.Module, max_cache: int, batch: int = 1) -> nn.Module:
    """One decode step of `model` in transformers' static-cache export wrapper (its own cache buffers)."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    from opgen.bench.decode_models import HFStep

    device = next(model.parameters()).device
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=batch, max_cache_len=max_cache, device=device)
    return HFStep(wrapper).eval().requires_grad_(False)
