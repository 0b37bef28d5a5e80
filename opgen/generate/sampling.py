"""How the next token is chosen, on the device: greedy, or sampled with temperature, top-k and top-p.

Sampling draws with the exponential race (argmax of p / E, E ~ Exp(1), which picks token i with
probability p_i, as gpt-fast does), so no kernel waits on the host. The draws come from one
`torch.Generator` on the device, seeded per call of the loop: one seed, one sequence of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from opgen.generate.errors import GenerationError


@dataclass(frozen=True, slots=True)
class Sampling:
    """temperature 0 is greedy (the argmax; top_k, top_p and seed unused). top_k 0 and top_p 1.0 keep
    every token. seed None draws a seed from torch's default generator (so `torch.manual_seed` governs it)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise GenerationError(f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise GenerationError(f"top_k must be an int >= 0 (0 keeps every token), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1] (1 keeps every token), got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise GenerationError(f"seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampling()


class Sampler:
    """Chooses each row's next token from logits [B, vocab]; one per generation (it owns the draws)."""

    def __init__(self, sampling: Sampling, device: torch.device) -> None:
        self.sampling = sampling
        self.generator: torch.Generator | None = None
        if not sampling.greedy:
            seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
            self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        if s.greedy:
            return logits.argmax(-1)
        scores = logits.float() / s.temperature
        if s.top_k and s.top_k < scores.size(-1):
            kth = torch.topk(scores, s.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if s.top_p < 1.0:
            scores = _top_p(scores, s.top_p)
        probs = torch.softmax(scores, dim=-1)
        race = torch.empty_like(probs).exponential_(1.0, generator=self.generator)
        return (probs / race).argmax(-1)


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities sum to at least top_p (always the first)."""
    ordered, order = torch.sort(scores, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each
    ordered = ordered.masked_fill(before >= top_p, -math.inf)
    return torch.empty_like(scores).scatter_(-1, order, ordered)
