"""Lowering user Triton kernels in captured graphs to opgen's JIT launcher.

`torch.library.wrap_triton` kernels (and `triton_op`s, decomposed into them at capture) reach the
graph as `triton_kernel_wrapper_functional(kernel_idx, constant_args_idx, grid, kwargs,
tensors_to_clone)`: the kernel, its arguments by name, the grid(s) evaluated at trace time (one per
autotune config), and the written tensors, which the functional form copies first and returns.
Each becomes: one clone per written tensor, then one `KernelCall(jit=True)` whose callee is a JIT
launcher bound at load time from a `JitKernelSpec` (plain data: the kernel's `module:qualname`, its
configs and fixed grids), so the generated code calls it as it calls kernel_ops.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from opgen.runtime.errors import UnsupportedOpError
from opgen.runtime.ir import Arg, JitKernelSpec, KernelCall, Ref, Sym, Value
from opgen.runtime.lowering.fx_values import tensor_meta, to_arg

_FUNCTIONAL = "triton_kernel_wrapper_functional"
_MUTATION = "triton_kernel_wrapper_mutation"


def is_triton_node(node: torch.fx.Node) -> bool:
    return getattr(node.target, "__name__", None) in (_FUNCTIONAL, _MUTATION) or str(node.target) in (
        _FUNCTIONAL,
        _MUTATION,
    )


def lower_triton(lowering: Any, node: torch.fx.Node) -> tuple[KernelCall, ...]:
    """The lines of one Triton kernel node; names its results in `lowering.names`."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kw = node.kwargs
    kernel = kernel_side_table.get_kernel(kw["kernel_idx"])
    fn, configs = _function_and_configs(kernel, node)
    grids = [tuple(int(d) for d in g) for g in kw["grid"]]
    if len(grids) != len(configs):
        raise UnsupportedOpError(_op(node), node.name, f"{len(grids)} grids for {len(configs)} configs")
    if kw.get("tma_descriptor_metadata"):
        raise UnsupportedOpError(_op(node), node.name, "TMA descriptors are not supported by opgen's launcher yet")
    values = {**kernel_side_table.get_constant_args(kw["constant_args_idx"]), **kw["kwargs"]}
    where = f"node '{node.name}'"
    runtime = [p.name for p in fn.params if not p.is_constexpr]
    missing = [n for n in runtime if n not in values]
    if missing:
        raise UnsupportedOpError(_op(node), node.name, f"no value for kernel parameters {missing}")
    functional = str(getattr(node.target, "__name__", node.target)) == _FUNCTIONAL
    to_clone = list(kw.get("tensors_to_clone", ())) if functional else []
    lines: list[KernelCall] = []
    args: dict[str, Arg] = {}
    for name in runtime:
        value = values[name]
        arg = to_arg(value, lowering.names, where) if isinstance(value, torch.fx.Node) else _literal(value, node)
        if name in to_clone and isinstance(value, torch.fx.Node):
            copy = lowering.new_buf()
            meta = tensor_meta(value.meta["val"], where)
            lines.append(
                KernelCall("clone", (arg,), (("memory_format", Sym("memory_format", "preserve_format")),),
                           (Value(copy, meta),), f"{node.name} (copy of {name})", "aten.clone.default")
            )  # fmt: skip
            arg = Ref(copy)
        args[name] = arg
    spec = _spec(lowering, fn, configs, grids, values, runtime, to_clone or _written(kw, node), node)
    from opgen.jit.graph import remember  # opgen.jit imports the runtime's errors and cache

    remember(spec.kernel, fn)
    mutates = tuple(a.name for n, a in args.items() if isinstance(a, Ref) and n in spec.mutates)
    lines.append(
        KernelCall(spec.local, tuple(args[n] for n in runtime), (), (), node.name, f"triton:{spec.kernel}",
                   mutates=mutates, jit=True)
    )  # fmt: skip
    if functional:
        lowering.names[node.name] = {n: args[n] for n in to_clone}
    lowering.jit_kernels.append(spec)
    return tuple(lines)


def _function_and_configs(kernel: Any, node: torch.fx.Node) -> tuple[Any, list[tuple[dict[str, Any], int, int]]]:
    """The JITFunction and [(meta, num_warps, num_stages)], one per config (a plain kernel has one)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, Autotuner):
        configs = [(dict(c.kwargs), c.num_warps, c.num_stages) for c in kernel.configs]
        kernel = kernel.fn
    else:
        configs = [({}, 4, 3)]
    if not isinstance(kernel, JITFunction):
        raise UnsupportedOpError(_op(node), node.name, f"a {type(kernel).__name__} kernel, not a @triton.jit function")
    return kernel, configs


def _spec(lowering: Any, fn: Any, configs: list[Any], grids: list[Any], values: dict[str, Any],
          runtime: list[str], written: list[str], node: torch.fx.Node) -> JitKernelSpec:  # fmt: skip
    constexprs = {p.name: values[p.name] for p in fn.params if p.is_constexpr and p.name in values}
    for name, value in constexprs.items():
        if not isinstance(value, (int, float, bool, str)) or value is None:
            raise UnsupportedOpError(_op(node), node.name, f"constexpr {name}={value!r} is not a plain value")
    full = tuple(
        (tuple(sorted({**constexprs, **meta}.items())), warps, stages, grid)
        for (meta, warps, stages), grid in zip(configs, grids, strict=True)
    )
    return JitKernelSpec(
        local=lowering.local(f"jit_{fn.__name__}"),
        kernel=f"{fn.fn.__module__}:{fn.fn.__qualname__}",
        params=tuple(runtime),
        configs=full,
        mutates=tuple(n for n in runtime if n in written),
        examples=tuple(_example(values[n]) for n in runtime),
        node=node.name,
        importable=_importable(fn),
    )


def _example(value: Any) -> tuple[str, Arg]:
    if isinstance(value, torch.fx.Node):
        val = value.meta["val"]
        return ("tensor", f"{str(val.dtype).removeprefix('torch.')}@{val.device}")
    return ("value", value)


def _written(kw: Any, node: torch.fx.Node) -> list[str]:
    """The mutation form writes what torch's analysis found; every tensor, to be safe."""
    return [k for k, v in kw["kwargs"].items() if isinstance(v, torch.fx.Node)]


def _literal(value: Any, node: torch.fx.Node) -> Arg:
    if value is None or isinstance(value, (bool, int, float)):
        return value  # type: ignore[no-any-return]
    raise UnsupportedOpError(_op(node), node.name, f"a kernel argument of type {type(value).__name__}")


def _importable(fn: Any) -> bool:
    """Can another process find the kernel by module:qualname? (Else the graph is not cached on disk.)"""
    try:
        obj: Any = importlib.import_module(fn.fn.__module__)
        for part in fn.fn.__qualname__.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return False
    return obj is fn


def _op(node: torch.fx.Node) -> str:
    return f"higher_order.{getattr(node.target, '__name__', node.target)}"
