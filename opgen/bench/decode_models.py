"""The models `python -m opgen.bench decode` runs: one decode step, batch 1, a static KV cache.

Each model is an `nn.Module` whose `forward(input_ids, cache_position)` takes the token ids [1, 1]
(int64) and the position [1] (int64) of one token, writes its keys and values into the cache at
that position and returns the logits [1, 1, vocab]. Two families, same shapes (`SHAPES`):

- `gpt_fast`: a Llama written as gpt-fast writes it (RMSNorm, rotary embedding from a real
  [max_seq, head_dim / 2, 2] table, grouped-query attention whose `KVCache` module holds registered
  k/v buffers written with `index_put_` at `cache_position`, SDPA with a boolean causal mask row,
  SiLU-gated MLP, tied or untied lm_head).
- `hf_llama`: transformers' `LlamaForCausalLM` built from a `LlamaConfig` with random weights (never
  downloaded), in transformers' static-cache export wrapper
  `transformers.integrations.executorch.TorchExportableModuleWithStaticCache`.

Weights are random (seeded) and built directly in the target dtype and on the target device, so an
8B-class model never exists in float32 on the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True, slots=True)
class Shape:
    """A Llama shape. `dtype` is the weights' and the cache's."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    dtype: torch.dtype
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "tiny": Shape("tiny", 128, 2, 4, 2, 256, 512, True, torch.float32),
    "1b": Shape("1b", 2048, 16, 32, 8, 8192, 128256, True, torch.bfloat16),  # Llama-3.2-1B
    "8b": Shape("8b", 4096, 32, 32, 8, 14336, 128256, False, torch.bfloat16),  # Llama-3.1-8B
}
FAMILIES = ("gpt_fast", "hf_llama")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class KVCache(nn.Module):
    """Keys and values of every position, [1, kv_heads, max_seq, head_dim], written in place."""

    def __init__(self, max_seq: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        shape = (1, kv_heads, max_seq, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k_cache[:, :, input_pos] = k  # index_put_
        self.v_cache[:, :, input_pos] = v
        return self.k_cache, self.v_cache


def apply_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x [1, t, heads, head_dim] rotated by freqs [t, head_dim / 2, 2] (cos, sin), pairs interleaved."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    freqs = freqs.view(1, pairs.size(1), 1, pairs.size(3), 2)
    out = torch.stack(
        [
            pairs[..., 0] * freqs[..., 0] - pairs[..., 1] * freqs[..., 1],
            pairs[..., 1] * freqs[..., 0] + pairs[..., 0] * freqs[..., 1],
        ],
        -1,
    )
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, shape: Shape, max_seq: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        kv_dim = shape.kv_heads * shape.head_dim
        self.wqkv = nn.Linear(shape.hidden, shape.hidden + 2 * kv_dim, bias=False)
        self.wo = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.kv_cache = KVCache(max_seq, shape.kv_heads, shape.head_dim, shape.dtype)

    def forward(
        self, x: torch.Tensor, freqs: torch.Tensor, mask: torch.Tensor, input_pos: torch.Tensor
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        kv_dim = self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.heads * self.head_dim, kv_dim, kv_dim], dim=-1)
        q = apply_rotary(q.view(batch, seq, self.heads, self.head_dim), freqs)
        k = apply_rotary(k.view(batch, seq, self.kv_heads, self.head_dim), freqs)
        v = v.view(batch, seq, self.kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = self.kv_cache.update(input_pos, k, v)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.w3 = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.w2 = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, shape: Shape, max_seq: int) -> None:
        super().__init__()
        self.attention = Attention(shape, max_seq)
        self.feed_forward = FeedForward(shape)
        self.attention_norm = RMSNorm(shape.hidden, shape.eps)
        self.ffn_norm = RMSNorm(shape.hidden, shape.eps)

    def forward(
        self, x: torch.Tensor, freqs: torch.Tensor, mask: torch.Tensor, input_pos: torch.Tensor
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """gpt-fast's `Transformer` for one decode step: forward(ids [1, t], input_pos [t]) -> logits [1, t, vocab]."""

    def __init__(self, shape: Shape, max_seq: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Block(shape, max_seq) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, shape.eps)
        self.output = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tied:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("freqs", rope_table(shape, max_seq), persistent=False)
        causal = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        mask = self.causal_mask[None, None, cache_position]
        freqs = self.freqs[cache_position]
        x = self.tok_embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, freqs, mask, cache_position)
        return self.output(self.norm(x))


def rope_table(shape: Shape, max_seq: int) -> torch.Tensor:
    """[max_seq, head_dim / 2, 2]: cos and sin of each position's angle per pair (float32)."""
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float32) / shape.head_dim))
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv)
    return torch.stack([angles.cos(), angles.sin()], -1)


def gpt_fast(shape: Shape, max_seq: int, device: torch.device, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(shape.dtype):
        model = Transformer(shape, max_seq)
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                nn.init.normal_(param, std=0.02)
    return model.eval().requires_grad_(False)


class HFStep(nn.Module):
    """transformers' static-cache wrapper called with (input_ids, cache_position) by position."""

    def __init__(self, wrapper: nn.Module) -> None:
        super().__init__()
        self.wrapper = wrapper

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.wrapper(input_ids=input_ids, cache_position=cache_position)  # type: ignore[no-any-return]


def hf_llama(shape: Shape, max_seq: int, device: torch.device, seed: int = 0) -> nn.Module:
    """LlamaForCausalLM with random weights in TorchExportableModuleWithStaticCache. Needs transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    config = LlamaConfig(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        vocab_size=shape.vocab,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=max(max_seq, 2048),
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.eps,
        use_cache=True,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(shape.dtype):
        model = LlamaForCausalLM(config)
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    wrapper = TorchExportableModuleWithStaticCache(model.eval(), batch_size=1, max_cache_len=max_seq, device=device)
    return HFStep(wrapper).eval().requires_grad_(False)


BUILDERS = {"gpt_fast": gpt_fast, "hf_llama": hf_llama}


def build(family: str, shape: Shape, max_seq: int, device: torch.device) -> nn.Module:
    return BUILDERS[family](shape, max_seq, device)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def estimated_bytes(shape: Shape) -> int:
    """Bytes of the model's parameters (every table counted whole), from its shape alone."""
    kv_dim = shape.kv_heads * shape.head_dim
    layer = shape.hidden * (2 * shape.hidden + 2 * kv_dim) + 3 * shape.hidden * shape.intermediate + 2 * shape.hidden
    tables = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    return (shape.layers * layer + tables + shape.hidden) * shape.dtype.itemsize


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one step reads: every parameter once (tied ones once), but only one row of
    an embedding table that no linear layer shares (the lookup reads one row)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[param.data_ptr()] = param.numel() * param.element_size()
    linear_weights = {m.weight.data_ptr() for m in model.modules() if isinstance(m, nn.Linear)}
    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.weight.data_ptr() not in linear_weights:
            table = module.weight
            seen[table.data_ptr()] = table.size(-1) * table.element_size()
    return sum(seen.values())


CACHE_NAMES = ("k_cache", "v_cache", "key_cache", "value_cache")


def kv_bytes_per_position(model: nn.Module) -> int:
    """Bytes of keys and values one position holds over all layers (cache buffers [1, heads, max_seq, dim])."""
    total = 0
    for name, buffer in model.named_buffers():
        if name.rsplit(".", 1)[-1].rstrip("_0123456789") in CACHE_NAMES:
            total += buffer.numel() // buffer.size(2) * buffer.element_size()
    return total
