"""The opgen runtime: FX graph -> wrapper IR -> passes -> generated Python calling kernel_ops.

Entry points: `opgen.compile(model, example_inputs)` (torch.export, no Dynamo on the call path) and
the torch.compile backend `opgen` (`opgen.runtime.backend.opgen_backend`). Modules, in pipeline
order: export (capture), lower (graph -> IR), ir, registry, passes/, python_backend (IR -> source),
artifact + cache (the compiled graph as data, on disk), executor (data -> callable), guards (the
input check), api and backend (the two entry points).
"""

from __future__ import annotations

from opgen.runtime.api import compile
from opgen.runtime.errors import (
    InputMismatchError,
    InputTypeError,
    OpgenError,
    OpgenWarning,
    RequiresGradError,
    UnsupportedOpError,
)
from opgen.runtime.report import Report

__all__ = [
    "InputMismatchError",
    "InputTypeError",
    "OpgenError",
    "OpgenWarning",
    "Report",
    "RequiresGradError",
    "UnsupportedOpError",
    "compile",
]
