"""The prompt's pass: fixed-size chunks replayed as a CUDA graph where the prompt fits, else the dynamic graph.

The dynamic prefill (one graph for every length, loop.py) calls its kernels one by one from the host:
a 1B model's prompt costs the same few milliseconds of launches at 32 tokens as at 512. A graph
compiled for a fixed chunk of C tokens fuses its kernels and, on a GPU, replays as a CUDA graph
with no host work per kernel. So a prompt of T tokens (a batch left-padded to its longest) is
left-padded further, to the next multiple of C, and runs as that many chunks of C, chunk j written
at cache positions j*C .. j*C+C-1 and attending to the chunks before it. The padding is each row's
(its offset grows by it: step.py's mask hides it and its positions start after it), so the tokens
are the ones an unpadded prefill gives. Padding takes cache positions: where the padded prompt and
the new tokens do not fit the cache, the dynamic graph runs the prompt as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Prefill:
    """The prompt's pass over one cache: `chunk` (compiled for `size` tokens; None: none) or `dynamic`."""

    dynamic: Step
    chunk: Step | None = None
    size: int = 0

    def padded(self, longest: int, new_tokens: int, max_cache: int) -> int:
        """The prompt length to run: the longest prompt, rounded up to whole chunks where that fits the cache."""
        if self.chunk is None:
            return longest
        rounded = -(-longest // self.size) * self.size
        return rounded if rounded + new_tokens <= max_cache else longest

    def __call__(self, ids: torch.Tensor, start: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The logits [B, vocab] of the last position of `ids` [B, P], written from cache position 0.

        `start` is the caller's position tensor; chunks set it to their first position."""
        batch, length = ids.shape
        if self.chunk is None or length % self.size:
            return self.dynamic(ids, start, offsets)
        count = length // self.size
        chunks = ids.reshape(batch, count, self.size).transpose(0, 1).contiguous()  # [count, B, C]: each contiguous
        logits = None
        for j in range(count):
            start.fill_(j * self.size)
            logits = self.chunk(chunks[j], start, offsets)
        assert logits is not None
        return logits
