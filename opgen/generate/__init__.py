"""`opgen.generate`: text generation from token ids, prefill to stop token, on compiled graphs.

    gen = opgen.generate.Generator(model)                  # a transformers causal LM
    out = gen([[1, 2, 3], [4, 5]], max_new_tokens=32)      # prompts of any lengths
    out.tokens                                             # each row's new tokens
    gen(prompts, 32, Sampling(temperature=0.8, top_p=0.9, seed=0), on_tokens=print)

`generate(model, prompts, max_new_tokens, ...)` does the same with a Generator made for the call.
Rooms: step.py (the model with its cache, as one function), prefill.py (prompts as whole chunks of a
static graph), sampling.py, landing.py (tokens to the host without waiting), loop.py (the loop),
__main__.py (`python -m opgen.generate`).
"""

from __future__ import annotations

from typing import Any

from opgen.generate.errors import GenerationError
from opgen.generate.loop import COMPILERS, EOS, Generation, Generator, Steps, StepTokens
from opgen.generate.sampling import GREEDY, Sampling

__all__ = ["COMPILERS", "EOS", "GREEDY", "Generation", "GenerationError", "Generator", "Sampling", "StepTokens",
           "Steps", "generate"]  # fmt: skip


def generate(model: Any, prompts: Any, max_new_tokens: int, sampling: Sampling = GREEDY, *, stop_tokens: Any = EOS,
             max_cache: int | None = None, **options: Any) -> Generation:  # fmt: skip
    """One generation with a Generator made for it (compiles each call: keep a Generator to reuse)."""
    return Generator(model, max_cache=max_cache, **options)(prompts, max_new_tokens, sampling, stop_tokens)
