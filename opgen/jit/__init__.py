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
    with an equal grid and meta. A grid function is equal to another with the same code and closure
    values (a traced grid bakes the closure's values in, so a function's identity is not enough)."""
    key = (_grid_key(grid), tuple(sorted(meta.items())))
    try:
        hash(key)
    except TypeError:  # an unhashable closure value or meta: nothing to reuse safely
        kernel(fn, grid, **meta)(*args)
        return
    launchers = fn.__dict__.setdefault("_opgen_launchers", {})
    found = launchers.get(key)
    if found is None:
        found = launchers[key] = kernel(fn, grid, **meta)
    found(*args)


def _grid_key(grid: Any) -> Any:
    if not callable(grid):
        return grid
    code = getattr(grid, "__code__", None)
    if code is None:
        return ("object", id(grid), grid)  # keeps the callable alive, so its id is never reused
    cells = tuple(c.cell_contents for c in getattr(grid, "__closure__", None) or ())
    return ("function", code, cells, getattr(grid, "__defaults__", None))


def stats() -> dict[str, float]:
    """Counters of this process: compiles, cache hits, rebuilt entries, tunes, picks and their times."""
    from opgen.jit.cache import STATS

    return STATS.snapshot()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opgen.jit' has no attribute {name!r}")
