"""The user extension modules this process has imported: their kernels join kernel_ops' in the runtime.

An extension is a module built with `opgen_add_extension` from the user's own spec (docs/spec.md: your
own kernels). Importing it calls `register(module)` (from its module init, csrc/opgen/module/module.cpp),
so a graph that calls one of its ops (`torch.ops.mylib.scaled_add`, through the entry's `torch_op`) runs
the user's kernel directly: `opgen.runtime.extension_registry` merges the registries.

Standard library only: an extension registers while it is being imported, before anything heavy runs.
"""

from __future__ import annotations

import threading
from types import ModuleType

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}  # module name -> module, in import order

_NEEDS = ("kernel_ops", "THUNKS", "THUNK_DIGEST", "register_thunks")


class ExtensionError(ImportError):
    """A module that cannot join the runtime: not an opgen extension, or another build of one imported."""


def register(module: ModuleType) -> None:
    """Record an extension module (its import does this); importing the same module again is a no-op."""
    name = getattr(module, "__name__", None)
    if not isinstance(name, str):
        raise ExtensionError(f"opgen.extensions.register: {module!r} is not a module")
    missing = [a for a in _NEEDS if not hasattr(module, a)]
    if missing or not hasattr(getattr(module, "kernel_ops", None), "get_kernel_ops_args_info"):
        raise ExtensionError(
            f"opgen.extensions.register: module '{name}' is not an opgen extension (it lacks "
            f"{', '.join(missing) or 'kernel_ops.get_kernel_ops_args_info'}); build it with opgen_add_extension"
        )
    with _lock:
        known = _modules.get(name)
        if known is not None and known is not module:
            if known.kernel_ops.BUILD_ID != module.kernel_ops.BUILD_ID:
                raise ExtensionError(
                    f"opgen.extensions.register: a second build of extension '{name}' "
                    f"(build {module.kernel_ops.BUILD_ID}) is imported beside the first "
                    f"({known.kernel_ops.BUILD_ID}); restart the process to use the new build"
                )
            return
        _modules[name] = module


def registered() -> tuple[ModuleType, ...]:
    """The extension modules imported so far, in import order."""
    with _lock:
        return tuple(_modules.values())


def find(name: str) -> ModuleType | None:
    """The registered extension called `name`, if it has been imported."""
    with _lock:
        return _modules.get(name)
