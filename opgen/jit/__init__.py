"""opgen.jit: Triton kernels launched directly from C++.

    import opgen.jit
    add = opgen.jit.kernel(add_kernel, grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),), BLOCK=1024)
    add(x, y, out, x.numel())          # a C++ launcher: no Python between this call and cuLaunchKernel

The compiled kernel (`KernelBinary`: binary, entry point, launch metadata, specialization) is plain
data; the launcher (`opgen._C.JitLauncher`) loads it once per device and on each call only checks
and packs the arguments, computes the grid and launches on the current stream. Compiling happens
in the background (`warmup`) or on the first call, autotuning (several `configs`) on the first call
with real arguments; binaries and picks are cached under OPGEN_CACHE_DIR/jit. Without a CUDA build,
a GPU or triton, every entry point raises `JitUnavailableError` and the rest of opgen works.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

# Importing this package imports nothing else: the generator (which runs inside the build, before
# the extension exists) reads opgen.jit.expr. Everything below resolves lazily.
_LAZY = {
    "Config": "opgen.jit.kernels",
    "JitError": "opgen.jit.errors",
    "JitUnavailableError": "opgen.jit.errors",
    "available": "opgen.jit.env",
    "missing": "opgen.jit.env",
}

__all__ = [
    "Config",
    "JitError",
    "JitUnavailableError",
    "available",
    "kernel",
    "launch",
    "missing",
    "stats",
]


def kernel(
    fn: Any,
    grid: Any,
    *,
    configs: Sequence[Any] | None = None,
    mutates: Sequence[str] | None = None,
    **meta: Any,
) -> Any:
    """The launcher of a @triton.jit function: call it with the kernel's runtime (non-constexpr)
    arguments, by position. `grid` is an int, a tuple, or a function of the meta-parameters (as
    for Triton). Constexprs come from `meta`, or `configs` (a list of `Config`) to autotune over;
    `mutates` names the arguments the kernel writes (autotuning copies them; default: all tensors).
    """
    from opgen.jit.kernels import Config, JitKernel

    if configs is not None and meta:
        raise TypeError("opgen.jit.kernel: give constexprs either as keywords or through configs, not both")
    chosen = tuple(configs) if configs is not None else (Config(meta),)
    return JitKernel(fn, grid, chosen, mutates=mutates).launcher


def launch(fn: Any, grid: Any, *args: Any, **meta: Any) -> None:
    """Launch once, like `fn[grid](*args, **meta)`; the launcher is kept on `fn` for the next call
    with the same grid and meta."""
    launchers = fn.__dict__.setdefault("_opgen_launchers", {})
    key = (id(grid) if callable(grid) else grid, tuple(sorted(meta.items())))
    found = launchers.get(key)
    if found is None:
        found = launchers[key] = kernel(fn, grid, **meta)
    found(*args)


def stats() -> dict[str, float]:
    """Counters of this process: compiles, cache hits, rebuilt entries, tunes, picks and their times."""
    from opgen.jit.cache import STATS

    return STATS.snapshot()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opgen.jit' has no attribute {name!r}")
