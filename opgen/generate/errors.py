"""The loop's one error type: bad input to generation, raised before any work."""

from __future__ import annotations


class GenerationError(ValueError):
    """Generation cannot run as asked: a bad prompt, model, setting or cache size. The message says which."""
