"""The JIT's exceptions."""

from __future__ import annotations

from opgen.errors import OpgenError


class JitError(OpgenError):
    """A Triton kernel cannot be compiled, tuned or launched as asked; the message says why."""


class JitUnavailableError(JitError):
    """This process cannot run JIT kernels: no CUDA build of opgen, no GPU, or no triton."""
