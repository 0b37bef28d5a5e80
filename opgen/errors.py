"""The roots of opgen's own exceptions and warnings, below both the runtime and the JIT.

Every error opgen raises itself derives from `OpgenError` (a `RuntimeError`), except where a
standard type says more (`TypeError`, `ValueError`); every warning it gives is an `OpgenWarning`.
"""

from __future__ import annotations


class OpgenError(RuntimeError):
    """Base class of opgen's own errors."""


class OpgenWarning(UserWarning):
    """The category of every warning opgen itself gives; each says what to do about it."""
