"""The opgen runtime: FX graph -> wrapper IR -> passes -> generated code calling kernel_ops.

Entry points are the `frontend` room: `opgen.compile(model, example_inputs)` (torch.export, no
Dynamo on the call path), the torch.compile backend `opgen` (`frontend.dynamo`) and `opgen.package`
/ `opgen.load_package` (a compiled graph as one file the C++ executor runs, with or without Python).
`pipeline` takes one graph through the rooms, each a package in data-flow order: `capture` (graph
and signature), `lowering` (graph -> IR), `ir` (the IR) with `registry` (what kernel_ops binds),
`passes` (IR -> IR; fusion decides groups), `codegen` (IR -> source: one printer per language, and
`codegen/triton` for generated kernels), `artifact` (the compiled graph as data, and its disk cache),
`execution` (artifact -> callable: executor, input checks, CUDA graphs) and `backends` (what runs a
graph besides the generated Python: each prints its program and binds it). Which room may import
which is `tests/test_layering.py`.
"""

from __future__ import annotations

import opgen
from opgen.runtime.errors import (  # noqa: F401 - exported through __all__ below
    InputMismatchError,
    InputTypeError,
    OpgenError,
    OpgenWarning,
    PackageError,
    RequiresGradError,
    UnsupportedOpError,
)
from opgen.runtime.execution.collectives import ProcessGroupError  # noqa: F401
from opgen.runtime.frontend import compile, load_package, package  # noqa: F401
from opgen.runtime.report import Report  # noqa: F401

# The public API is declared once, in `opgen.__all__` (which resolves these names lazily); Report is
# the one runtime type users meet without importing it by name (`fn.report()`).
__all__ = sorted((set(opgen.__all__) - {"kernel_ops"}) | {"Report"})
