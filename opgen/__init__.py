"""opgen: direct PyTorch kernel bindings generated from an op spec, and a fast runtime on top.

`from opgen import kernel_ops` loads the compiled extension (importing torch first). The generator
(`python -m opgen`) imports neither torch nor the extension, so it can run inside the build.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "InputMismatchError",
    "InputTypeError",
    "OpgenError",
    "OpgenWarning",
    "PackageError",
    "ProcessGroupError",
    "RequiresGradError",
    "UnsupportedOpError",
    "compile",
    "kernel_ops",
    "load_package",
    "package",
]

# Resolved lazily from opgen.runtime (which imports torch) on first access.
_RUNTIME_EXPORTS = frozenset(__all__) - {"kernel_ops"}


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_EXPORTS:
        return getattr(importlib.import_module("opgen.runtime"), name)
    if name == "kernel_ops":
        importlib.import_module("torch")  # the extension resolves its symbols from libtorch
        module = importlib.import_module("opgen._C").kernel_ops
        import sys

        sys.modules.setdefault("opgen.kernel_ops", module)
        return module
    raise AttributeError(f"module 'opgen' has no attribute '{name}'")
