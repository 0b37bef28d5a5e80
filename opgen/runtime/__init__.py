"""The opgen runtime: FX graph -> wrapper IR -> passes -> generated code calling kernel_ops.

Entry points: `opgen.compile(model, example_inputs)` (`api`: torch.export, no Dynamo on the call
path), the torch.compile backend `opgen` (`dynamo_backend`) and `opgen.package` /
`opgen.load_package` (`packaging`: a compiled graph as one file the C++ executor runs, with or
without Python); `pipeline` takes one graph through the rooms, each a package in data-flow order:
`capture` (graph and signature), `lowering` (graph -> IR), `ir` (the IR) with `registry` (what
kernel_ops binds), `passes` (IR -> IR, fusion inside), `codegen` (IR -> source, one backend per
language), `artifact` (the compiled graph as data, and its disk cache), `execution` (artifact ->
callable: executor, input checks, CUDA graphs). Which room may import which is
`tests/test_layering.py`.
"""

from __future__ import annotations

from opgen.runtime.api import compile
from opgen.runtime.errors import (
    InputMismatchError,
    InputTypeError,
    OpgenError,
    OpgenWarning,
    PackageError,
    RequiresGradError,
    UnsupportedOpError,
)
from opgen.runtime.execution.collectives import ProcessGroupError
from opgen.runtime.packaging import load_package, package
from opgen.runtime.report import Report

__all__ = [
    "InputMismatchError",
    "InputTypeError",
    "OpgenError",
    "OpgenWarning",
    "PackageError",
    "ProcessGroupError",
    "Report",
    "RequiresGradError",
    "UnsupportedOpError",
    "compile",
    "load_package",
    "package",
]
