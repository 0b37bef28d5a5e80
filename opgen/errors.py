"""The roots of opgen's own exceptions and warnings, below both the runtime and the JIT.

Every error opgen raises itself derives from `OpgenError` (a `RuntimeError`), except where a
standard type says more (`TypeError`, `ValueError`); every warning it gives is an `OpgenWarning`.
"""

from __future__ import annotations

import sys
import warnings


class OpgenError(RuntimeError):
    """Base class of opgen's own errors."""


class OpgenWarning(UserWarning):
    """The category of every warning opgen itself gives; each says what to do about it."""


_INTERNAL = ("opgen", "torch")  # packages whose frames a warning passes over (opgen's generated code too)


def warn(message: str, category: type[Warning] = OpgenWarning) -> None:
    """`warnings.warn` attributed to the first frame outside opgen and torch: the user's line that
    compiled or called (under torch.compile, the code that called the compiled model), however deep
    opgen's own call chain is. A fixed `stacklevel` named an opgen file whenever that chain changed.
    Frames are told by their module's name (`opgen.runtime...`, generated code's `opgen.generated_...`)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _internal(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)


def _internal(module: str) -> bool:
    return module.partition(".")[0] in _INTERNAL
