"""Tensor-parallel shards of the decode bench's gpt-fast Llama (`decode_models.Transformer`), split as gpt-fast does.

`shard(model, rank, world, group)` turns the whole model, built from one seed in every rank, into this
rank's part of it, in place (Megatron's split):

- attention: the rank's query heads and key/value heads (column-parallel `wqkv`, the cache sliced the
  same way), `wo` row-parallel, its output summed over the ranks (`all_reduce`);
- MLP: `w1` and `w3` column-parallel, `w2` row-parallel, its output summed over the ranks;
- the output head split over the vocabulary, the logits gathered from every rank (`all_gather`); a
  head tied to the embedding is untied (the embedding stays whole: a step reads one row of it);
- norms, rotary table and mask replicated.

Collectives are torch's functional ops (`_c10d_functional.all_reduce`, `all_gather_into_tensor`, each
followed by `wait_tensor`), as torch.compile and torch.export trace `torch.distributed` calls.
`fill_caches` writes the same random keys and values into the whole model's cache in every rank,
before sharding, so that a step attends to a full context.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from opgen.bench.decode_models import Transformer


class _Sharded(nn.Module):
    """A linear layer's part on this rank, and the group its collective runs on."""

    def __init__(self, weight: torch.Tensor, group: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.group = group


class RowParallel(_Sharded):
    """`x @ w.T` of this rank's columns of `w`, summed over the ranks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _wait(torch.ops._c10d_functional.all_reduce(F.linear(x, self.weight), "sum", self.group.group_name))


class VocabParallel(_Sharded):
    """The logits of this rank's rows of the head, gathered from every rank along the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        world = self.group.size()
        part = torch.ops._c10d_functional.all_gather_into_tensor(F.linear(x, self.weight), world, self.group.group_name)
        return torch.cat(_wait(part).chunk(world), dim=-1)


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(tensor)


def _part(n: int, rank: int, world: int, what: str) -> slice:
    if n % world:
        raise ValueError(f"{what} ({n}) does not split over {world} ranks")
    size = n // world
    return slice(rank * size, (rank + 1) * size)


def _rows(weight: torch.Tensor, part: slice) -> torch.Tensor:
    return weight[part].clone()


def shard(model: Transformer, rank: int, world: int, group: Any) -> Transformer:
    """This rank's shard of `model` (in place; `world` 1 leaves it whole)."""
    if world == 1:
        return model
    for block in model.layers:
        attention, mlp = block.attention, block.feed_forward
        heads, kv_heads, dim = attention.heads, attention.kv_heads, attention.head_dim
        q_part = _part(heads, rank, world, "attention heads")
        kv_part = _part(kv_heads, rank, world, "key/value heads")
        q, k, v = attention.wqkv.weight.split([heads * dim, kv_heads * dim, kv_heads * dim])
        parts = ((q, q_part), (k, kv_part), (v, kv_part))
        rows = [t.view(-1, dim, t.size(-1))[p].reshape(-1, t.size(-1)) for t, p in parts]
        attention.wqkv.weight = nn.Parameter(torch.cat(rows), requires_grad=False)
        wo = attention.wo.weight.view(-1, heads, dim)[:, q_part].reshape(attention.wo.weight.size(0), -1)
        attention.wo = RowParallel(wo.clone(), group)  # type: ignore[assignment]
        attention.heads, attention.kv_heads = heads // world, kv_heads // world
        cache = attention.kv_cache
        cache.k_cache = cache.k_cache[:, kv_part].clone()
        cache.v_cache = cache.v_cache[:, kv_part].clone()
        hidden = _part(mlp.w1.weight.size(0), rank, world, "MLP width")
        mlp.w1.weight = nn.Parameter(_rows(mlp.w1.weight, hidden), requires_grad=False)
        mlp.w3.weight = nn.Parameter(_rows(mlp.w3.weight, hidden), requires_grad=False)
        mlp.w2 = RowParallel(mlp.w2.weight[:, hidden].clone(), group)  # type: ignore[assignment]
    vocab = _part(model.output.weight.size(0), rank, world, "vocabulary")
    model.output = VocabParallel(_rows(model.output.weight, vocab), group)  # type: ignore[assignment]
    return model


@torch.no_grad()
def fill_caches(model: Transformer, positions: int, seed: int = 1) -> None:
    """Random keys and values (std 1, seeded) at positions [0, positions) of every layer's cache."""
    generator = torch.Generator(device=model.freqs.device).manual_seed(seed)
    for block in model.layers:
        for cache in (block.attention.kv_cache.k_cache, block.attention.kv_cache.v_cache):
            values = torch.randn(cache[:, :, :positions].shape, generator=generator, device=cache.device)
            cache[:, :, :positions] = values.to(cache.dtype)
