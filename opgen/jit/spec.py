"""Triton ops of the spec: the launcher behind a generated `kernel_ops` function.

The generated binding of a Triton op (backend `triton` in the registry) allocates its outputs,
computes the kernel's arguments and, on its first call, asks `launcher(entry_json)` for the op's
launcher, passing its own registry entry; from then on it launches through that launcher
directly. The entry's `triton` section names the kernel (`module:qualname`, imported here, at run
time), its runtime parameters, grid and configs.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from opgen.jit.errors import JitError
from opgen.jit.kernels import Config, JitKernel
from opgen.jit.specialize import runtime_params


def launcher(entry_json: str, native: Any = None) -> Any:
    """The launcher of a spec's Triton op, made of `native`'s JitLauncher type: the extension module whose
    binding asks (opgen._C, or a user's own extension; default opgen._C)."""
    entry = json.loads(entry_json)
    section = entry["triton"]
    op = entry["name"]
    fn = load_kernel(section["kernel"], op)
    names = [p.name for p in runtime_params(fn)]
    if names != list(section["params"]):
        raise JitError(
            f"kernel_ops.{op}: its spec entry ({entry.get('location', '?')}) passes parameters "
            f"{section['params']} but {section['kernel']} takes {names} (constexprs excluded); fix `args` in the spec"
        )
    configs = [Config(c["meta"], c["num_warps"], c["num_stages"]) for c in section["configs"]]
    written = set(section["outputs"]) | set(entry.get("mutates", ()))
    mutates = [p for p in names if section["args"][p] in written]
    kernel = JitKernel(fn, tuple(section["grid"]), configs, mutates=mutates, name=op, native=native)
    return kernel.launcher


def load_kernel(reference: str, op: str) -> Any:
    """`package.module:function` -> the @triton.jit function, or a JitError saying what failed."""
    module_name, _, qualname = reference.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise JitError(f"kernel_ops.{op}: cannot load its Triton kernel {reference}: {exc}") from exc
    from triton.runtime.jit import JITFunction

    if not isinstance(obj, JITFunction):
        raise JitError(f"kernel_ops.{op}: {reference} is a {type(obj).__name__}, not a @triton.jit function")
    return obj
