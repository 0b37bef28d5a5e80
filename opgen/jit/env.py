"""What the JIT needs from this process, and the facts its cache keys hold.

`require()` is the one place that checks the prerequisites; everything else in opgen.jit calls it
before touching triton or the GPU, so without them each entry point raises one clear error and the
rest of opgen imports and works.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType
from typing import Any

import torch

from opgen.jit.errors import JitUnavailableError


def native() -> Any:
    """The extension module, if this build has the JIT launcher (a CUDA build), else None."""
    try:
        module = importlib.import_module("opgen._C")
    except ImportError:
        return None
    return module if hasattr(module, "JitLauncher") else None


def missing() -> list[str]:
    """What this process lacks to run JIT kernels (empty when nothing)."""
    problems = []
    if native() is None:
        problems.append("opgen was built against a torch without CUDA (rebuild it with a CUDA torch)")
    if not torch.cuda.is_available():
        problems.append("no CUDA device is available")
    if importlib.util.find_spec("triton") is None:
        problems.append("triton is not installed (pip install triton)")
    return problems


def available() -> bool:
    return not missing()


def require() -> ModuleType:
    """The triton module, or JitUnavailableError naming everything that is missing."""
    problems = missing()
    if problems:
        raise JitUnavailableError("opgen.jit cannot run Triton kernels here: " + "; ".join(problems) + ".")
    return importlib.import_module("triton")


@functools.cache
def target(device: int) -> Any:
    """Triton's compile target for a device."""
    from triton.backends.compiler import GPUTarget

    major, minor = torch.cuda.get_device_capability(device)
    return GPUTarget("cuda", major * 10 + minor, 32)


@functools.cache
def shared_memory_limit(device: int) -> int:
    """Bytes of shared memory one program may have on a device (the opt-in maximum a launch may ask for)."""
    return int(getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 49152))


def fits(shared: int, device: int) -> bool:
    """Whether a binary that needs `shared` bytes of shared memory can be launched on the device."""
    return shared <= shared_memory_limit(device)


@functools.cache
def fingerprint(device: int) -> tuple[str, ...]:
    """What a binary depends on besides its source and specialization: architecture and versions."""
    import triton

    arch = target(device).arch
    driver = native().cuda_driver_version()  # type: ignore[union-attr]
    return (f"sm{arch}", f"triton {triton.__version__}", f"cuda {torch.version.cuda}", f"driver {driver}")
