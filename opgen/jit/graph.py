"""JIT launchers for a compiled graph's Triton kernels (`Program.jit_kernels`), built when the graph
is bound: each kernel starts compiling in the background then, for the specialization its example
arguments predict, so the first call usually finds its binary ready; autotuning (for kernels with
several configs) happens on that first call, with the real tensors."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opgen.jit.errors import JitError
from opgen.jit.kernels import Config, JitKernel

# Kernels seen while lowering in this process, by "module:qualname": kernels defined where another
# process cannot import them (a function's locals, __main__) still bind in the process that traced them.
_KNOWN: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def remember(reference: str, fn: Any) -> None:
    _KNOWN[reference] = fn


def load(reference: str) -> Any:
    found = _KNOWN.get(reference)
    if found is not None:
        return found
    from opgen.jit.spec import load_kernel

    try:
        return load_kernel(reference, "graph")
    except JitError as exc:
        raise JitError(f"a compiled graph launches Triton kernel {reference}, which cannot be loaded: {exc}") from exc


def launchers(specs: Sequence[Any], inputs: Sequence[Any] = ()) -> dict[str, Any]:
    return {
        spec.local: fixed_grid_launcher(
            load(spec.kernel), spec.configs, spec.params, spec.mutates, spec.local,
            lambda spec=spec: [_example(kind, value) for kind, value in spec.examples],
        )
        for spec in specs
    }  # fmt: skip


def fixed_grid_launcher(
    fn: Any,
    configs: Sequence[Any],
    params: Sequence[str],
    mutates: Sequence[str],
    name: str,
    examples: Callable[[], Sequence[Any]],
    dependent_launch: bool = False,
) -> Any:
    """The launcher of a kernel whose grid each config fixed at compile time ((meta, warps, stages, grid)
    per config); it starts compiling for the arguments `examples()` makes, so the first call usually
    finds it ready (where they cannot be made or compiled, the first call says why).
    `dependent_launch`: see `JitKernel`."""
    grids = {tuple(sorted(meta)): grid for meta, _, _, grid in configs}

    def grid(meta: dict[str, Any]) -> Any:
        return grids[tuple(sorted((k, v) for k, v in meta.items() if k not in params))]

    chosen = [Config(dict(meta), warps, stages) for meta, warps, stages, _ in configs]
    kernel = JitKernel(fn, grid, chosen, mutates=mutates, name=name, dependent_launch=dependent_launch)
    try:
        kernel.warmup(*examples())
    except (JitError, TypeError, ValueError, RuntimeError):
        pass  # the first call compiles, and raises what is wrong there
    return kernel.launcher


def choices(specs: Sequence[Any], kernel_ops: Any) -> dict[str, Any]:
    """The callable for each `KernelChoice`: a `Choice` between kernel_ops functions, its C++ switch
    pointed at the pick once made (the graph's sizes are fixed); `.choice` reaches the Choice."""
    from opgen.jit.choice import Choice

    out = {}
    for spec in specs:
        candidates = {name: getattr(kernel_ops, name) for name in spec.candidates}
        identity = (spec.target, getattr(kernel_ops, "BUILD_ID", ""))
        choice = Choice(f"node '{spec.node}' ({spec.target})", candidates, identity=identity, fixed_sizes=True,
                        names=(spec.local, spec.node))  # fmt: skip
        call = choice.call
        if call is not choice._dispatch:
            call.choice = choice
        out[spec.local] = call
    return out


def _example(kind: str, value: Any) -> Any:
    if kind != "tensor":
        return value
    dtype, _, device = value.partition("@")
    return torch.empty(16, dtype=getattr(torch, dtype), device=device)
