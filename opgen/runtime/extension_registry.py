"""kernel_ops' registry with the imported extensions' registries beside it, and the kernels they name.

An extension's function `scaled_add` (module `my_ops`) joins the registry as `my_ops__scaled_add`: one
name the generated Python binds as a local and the C++ executor finds as a thunk (its tables are
registered with opgen's executor under the prefix `my_ops__`), so it never meets a kernel_ops name. Its
`torch_op` (`mylib::scaled_add`) joins `by_aten`, so lowering calls it for `torch.ops.mylib.scaled_add`.
An op both kernel_ops and an extension bind keeps kernel_ops' kernel; two extensions binding one op
is an error naming both (entries without `torch_op`, `opgen::<name>`, are reached by name only). An
extension's Triton op with `candidate_for` its custom op (`mylib.scaled_add.default`) joins the
kernel choice of that op's nodes (the opt-in `kernel_choice` pass), as kernel_ops' Triton ops do for ATen's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from opgen.runtime.errors import OpgenError
from opgen.runtime.registry import KernelRegistry, OpInfo, load_registry


def prefix(module: ModuleType) -> str:
    """What an extension's function names start with in the merged registry (`my_ops__`)."""
    return module.__name__.replace(".", "_") + "__"


def merged(base: KernelRegistry, modules: Iterable[ModuleType]) -> KernelRegistry:
    """`base` (kernel_ops') with each extension's ops added under its prefix."""
    by_name, by_aten = dict(base.by_name), dict(base.by_aten)
    build = [base.build_id]
    for module in modules:
        own = load_registry(module.kernel_ops)
        build.append(f"{module.__name__}:{own.build_id}")
        for info in own.by_name.values():
            renamed = _renamed(info, prefix(module), module.__name__)
            if renamed.name in by_name:
                raise OpgenError(
                    f"extension '{module.__name__}' binds '{info.name}', whose runtime name "
                    f"'{renamed.name}' is kernel_ops' own: rename one of them in its spec"
                )
            by_name[renamed.name] = renamed
            holder = by_aten.get(renamed.aten)
            if holder is None:
                by_aten[renamed.aten] = renamed
            elif holder.module and holder.variant == renamed.variant and not renamed.aten.startswith("opgen::"):
                raise OpgenError(
                    f"op {renamed.aten} is bound by two extensions, '{holder.module}' ({holder.name}) and "
                    f"'{module.__name__}' ({renamed.name}); one process can call only one: import one of them"
                )
    return KernelRegistry(by_name, by_aten, "+".join(build), base.facts)


def _renamed(info: OpInfo, pre: str, module: str) -> OpInfo:
    def own(name: str | None) -> str | None:
        return pre + name if name else None

    return dataclasses.replace(
        info,
        name=pre + info.name,
        functional=own(info.functional),
        inplace=own(info.inplace),
        out=own(info.out),
        module=module,
    )


class Kernels:
    """kernel_ops' functions and the extensions' (by their prefixed names): what generated code binds."""

    __slots__ = ("_base", "_extra")

    def __init__(self, base: Any, extra: Mapping[str, Callable[..., Any]]) -> None:
        self._base = base
        self._extra = dict(extra)

    def __getattr__(self, name: str) -> Any:
        extra = self._extra.get(name)
        return extra if extra is not None else getattr(self._base, name)


def kernels(kernel_ops: Any, modules: Iterable[ModuleType]) -> Any:
    """`kernel_ops` itself without extensions, else a namespace that adds their functions."""
    extra = {
        prefix(m) + name: getattr(m.kernel_ops, name) for m in modules for name in m.kernel_ops.get_kernel_op_names()
    }
    return Kernels(kernel_ops, extra) if extra else kernel_ops


def register_thunks(executor: Any, modules: Iterable[ModuleType]) -> None:
    """Give opgen's C++ executor (`opgen._C`) each extension's thunk tables, under its prefix."""
    for module in modules:
        try:
            executor.register_thunks(prefix(module), module.THUNKS)
        except ValueError as exc:
            raise OpgenError(f"extension '{module.__name__}' cannot run on opgen's C++ executor: {exc}") from exc
