"""The runtime's entry points: what a user calls, each a thin front over the same pipeline and bind path.

- `compile` (`opgen.compile`): torch.export, then the pipeline, one function per input signature
  (`policy`: when to compile, what a call that fits nothing does; `specializations`: the versions).
- `dynamo.opgen_backend` (`torch.compile(model, backend="opgen")`): Dynamo and aot_autograd, then
  the same pipeline.
- `package` / `load_package` (`opgen.package`): a compiled graph as one file for the C++ executor.

Both compiling entry points bind through `bind.bind`; the loader binds through the C++ backend. This
room may import every room below it; nothing below imports it.
"""

from __future__ import annotations

from opgen.runtime.frontend.opgen_compile import compile
from opgen.runtime.frontend.packaging import load_package, package

__all__ = ["compile", "load_package", "package"]
