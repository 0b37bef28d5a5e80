"""A transformers causal LM as one function of a static KV cache, for prefill and decode alike.

`CachedLM(model, batch, max_cache)` owns the cache (transformers' `StaticCache`, registered as buffers
through its static-cache export wrapper) and takes

    forward(input_ids [B, T], start [1], offsets [B]) -> logits [B, vocab] of the last position

- `start`: the cache position of the first of the T tokens; they are written at start .. start+T-1.
- `offsets`: per row, how many left-padding positions its prompt has. Row b's token at cache position
  p sits at position p - offsets[b] of its own sequence (the rotary angle), and attends to the keys
  offsets[b] .. p, so rows of different lengths decode side by side, each at its own position.

The mask and the positions are computed in the graph from these two small inputs: a decode step's
only per-call inputs are the new tokens and `start`. One module serves both graphs: the prefill
(T dynamic) and the decode step (T = 1), which share the cache buffers.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from opgen.generate.errors import GenerationError


class CachedLM(nn.Module):
    def __init__(self, model: nn.Module, batch: int, max_cache: int) -> None:
        super().__init__()
        check_model(model)
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        device = next(model.parameters()).device
        # The wrapper builds the cache as the installed transformers wants it and registers its
        # tensors as buffers; we call the model ourselves with positions and a mask.
        self.cached = TorchExportableModuleWithStaticCache(model, batch_size=batch, max_cache_len=max_cache,
                                                           device=device)  # fmt: skip
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = "logits_to_keep" in params
        self.batch, self.max_cache = batch, max_cache
        self.dtype = next(model.parameters()).dtype
        self._bool_mask = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.register_buffer("keys_index", torch.arange(max_cache, device=device), persistent=False)

    def forward(self, input_ids: torch.Tensor, start: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        cache = self.cached.static_cache
        for layer in cache.layers:
            layer.cumulative_length.copy_(start[0])
        length = input_ids.shape[1]
        positions = start + torch.arange(length, device=input_ids.device)  # [T], cache positions
        position_ids = (positions[None, :] - offsets[:, None]).clamp(min=0)  # [B, T], each row's own
        keys = self.keys_index
        causal = keys[None, :] <= positions[:, None]  # [T, max_cache]
        own = keys[None, :] >= offsets[:, None]  # [B, max_cache]: not the row's padding
        itself = keys[None, :] == positions[:, None]  # a padding query sees itself: no row is all masked (NaN)
        allowed = (causal[None, None] & own[:, None, None]) | itself[None, None]  # [B, 1, T, max_cache]
        if self._bool_mask:  # SDPA takes the boolean mask as it is (opgen's decode attention matches it)
            mask = allowed
        else:  # eager attention adds the mask to its scores
            mask = torch.zeros((), dtype=self.dtype, device=input_ids.device).masked_fill(
                ~allowed, torch.finfo(self.dtype).min
            )
        kwargs = {self._cache_arg: cache, "use_cache": True}
        if self._keep_arg:
            kwargs["logits_to_keep"] = 1
        out = self.cached.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, **kwargs)
        return out.logits[:, -1, :]


def check_model(model: object) -> None:
    """A clear error for what the loop cannot drive: no module, no causal-LM head, no static cache."""
    if not isinstance(model, nn.Module):
        raise GenerationError(f"opgen.generate takes a transformers causal LM, not {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "generation_config") or not hasattr(model, "get_output_embeddings"):
        raise GenerationError(f"{type(model).__name__} is not a transformers causal LM (it has no config, "
                              "generation_config or output embeddings)")  # fmt: skip
    if model.get_output_embeddings() is None:  # type: ignore[operator]
        raise GenerationError(f"{type(model).__name__} has no language-model head: use its *ForCausalLM class")
    if getattr(config, "is_encoder_decoder", False):
        raise GenerationError(f"{type(model).__name__} is an encoder-decoder model; the loop drives decoder-only LMs")
    if not getattr(model, "_supports_static_cache", True) or not getattr(model, "_can_compile_fullgraph", True):
        raise GenerationError(f"{type(model).__name__} does not support a static KV cache, which the loop needs")
