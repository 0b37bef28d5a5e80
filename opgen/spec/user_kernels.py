"""Kernel names, and the user's own kernels: `includes:` (their headers) and `torch_op:` (the op they implement).

    - func: scaled_add(Tensor self, Tensor other, float alpha=1) -> Tensor
      kernels: {cpu: mylib::scaled_add}
      includes: [mylib/scaled_add.h]
      torch_op: mylib::scaled_add

A kernel is ATen's (`at::<namespace>::<function>`), opgen's own (`opgen::kernels::<function>`), or any
other qualified C++ function (a user kernel), which needs `includes:`. User kernels are not checked here
against their headers (the generator cannot read them); the generated C++ checks them at compile time
and reports a mismatch at the spec's line (`opgen.gen.user_kernels`).
"""

from __future__ import annotations

import re
from typing import Any

from opgen.spec.model import BACKENDS, KERNEL_NAMESPACES, OWN_NAMESPACE, Kernel, OpSpec, TorchOp
from opgen.spec.problems import Problems

# \Z, not $: `$` also matches before a trailing newline, so 'add\n' would pass as a name.
_KERNEL = re.compile(r"^(?:at::(?P<ns>[a-z_]+)|(?P<own>opgen::kernels))::(?P<fn>[A-Za-z_][A-Za-z0-9_]*)\Z")
_USER_KERNEL = re.compile(r"^(?P<ns>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)::(?P<fn>[A-Za-z_]\w*)\Z", re.ASCII)
_TORCH_OP = re.compile(r"^(?P<ns>[A-Za-z_]\w*)::(?P<name>[A-Za-z_]\w*)(?:\.(?P<overload>[A-Za-z_]\w*))?\Z", re.ASCII)
_HEADER = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9_.+/-]*\.(?:h|hpp|cuh|hh)\Z", re.ASCII)
RESERVED_NAMESPACES = ("at", "opgen")  # ATen's and opgen's kernels have rules of their own


def parse_kernels(raw: Any, line: int, op: str, problems: Problems) -> tuple[Kernel, ...] | None:
    """`kernels:` -> one Kernel per backend, or None (each problem reported) if any is bad."""
    if not isinstance(raw, dict) or not raw:
        problems.add(line, op, f"'kernels' must map a backend ({', '.join(BACKENDS)}) to a kernel like at::cpu::add")
        return None
    kernels = []
    for backend, name in raw.items():
        if backend not in BACKENDS:
            problems.add(line, op, f"unknown backend '{backend}' (allowed: {', '.join(BACKENDS)})")
            continue
        kernel = _kernel(backend, name, line, op, problems)
        if kernel is not None:
            kernels.append(kernel)
    return tuple(kernels) if len(kernels) == len(raw) else None


def _kernel(backend: str, name: Any, line: int, op: str, problems: Problems) -> Kernel | None:
    match = _KERNEL.match(name) if isinstance(name, str) else None
    if match is None:
        user = _USER_KERNEL.match(name) if isinstance(name, str) else None
        if user is not None and user["ns"].split("::")[0] not in RESERVED_NAMESPACES:
            return Kernel(backend, user["ns"], user["fn"], user=True)
        problems.add(
            line,
            op,
            f"{backend} kernel {name!r} is not of the form at::<namespace>::<function>, "
            f"{OWN_NAMESPACE}::<function> or <your namespace>::<function> (with 'includes')",
        )
        return None
    namespace = match["ns"] or match["own"]
    spelled = namespace if match["own"] else f"at::{namespace}"
    if namespace not in KERNEL_NAMESPACES:
        allowed = ", ".join(ns if ns == OWN_NAMESPACE else f"at::{ns}" for ns in KERNEL_NAMESPACES)
        problems.add(line, op, f"{backend} kernel '{name}': unknown namespace (allowed: {allowed})")
    elif backend not in KERNEL_NAMESPACES[namespace]:
        problems.add(line, op, f"{backend} kernel '{name}': {spelled} kernels cannot serve '{backend}'")
    else:
        return Kernel(backend, namespace, match["fn"])
    return None


def includes(
    fields: dict[str, Any], lines: dict[str, int], kernels: tuple[Kernel, ...] | None, op: str, problems: Problems
) -> tuple[str, ...]:
    """`includes:`: required with user kernels, refused without them; each a safe relative header path."""
    users = [k for k in kernels or () if k.user]
    if "includes" not in fields:
        if users:
            line = lines.get("kernels", lines["func"])
            problems.add(
                line,
                op,
                f"{users[0].backend} kernel '{users[0].qualified_name}' is a user kernel: "
                "name the headers that declare it in 'includes' (like includes: [mylib/ops.h])",
            )
        return ()
    value, line = fields["includes"], lines["includes"]
    if kernels is not None and not users and not _variants_name_user_kernels(fields):
        problems.add(line, op, "'includes' is only for user kernels (ATen's and opgen's headers are included already)")
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        problems.add(line, op, f"'includes' must be a list of header names (like [mylib/ops.h]), not {value!r}")
        return ()
    bad = [v for v in value if not _HEADER.match(v) or ".." in v.split("/") or "//" in v]
    for header in bad:
        problems.add(
            line,
            op,
            f"'includes': {header!r} is not a header name: a relative path ending in .h, .hpp, .cuh or .hh, "
            "without '..'",
        )
    return () if bad else tuple(dict.fromkeys(value))


def _variants_name_user_kernels(fields: dict[str, Any]) -> bool:
    """An `inplace:`/`out:` mapping names user kernels of its own (checked with the variant)."""
    for key in ("inplace", "out"):
        raw = fields.get(key)
        names = raw.get("kernels") if isinstance(raw, dict) else None
        if isinstance(names, dict) and any(
            isinstance(n, str) and _USER_KERNEL.match(n) and n.split("::")[0] not in RESERVED_NAMESPACES
            for n in names.values()
        ):
            return True
    return False


def torch_op(
    fields: dict[str, Any], lines: dict[str, int], kernels: tuple[Kernel, ...] | None, op: str, problems: Problems
) -> TorchOp | None:
    """`torch_op: ns::name[.overload]`: the torch.library op an entry with user kernels implements."""
    if "torch_op" not in fields:
        return None
    value, line = fields["torch_op"], lines["torch_op"]
    match = _TORCH_OP.match(value) if isinstance(value, str) else None
    if match is None:
        form = "ns::name or ns::name.overload (like mylib::scaled_add)"
        problems.add(line, op, f"'torch_op' must be {form}, not {value!r}")
        return None
    if kernels is not None and not any(k.user for k in kernels):
        problems.add(line, op, "'torch_op' is only for entries with user kernels (an ATen op is named by its schema)")
        return None
    return TorchOp(match["ns"], match["name"], match["overload"] or "default")


def check_registry_names(ops: list[OpSpec], problems: Problems) -> None:
    """A `torch_op` names one entry only: no other entry may have the same registry name."""
    first: dict[str, OpSpec] = {}
    for spec in ops:
        name = spec.registry_name
        other = first.setdefault(name, spec)
        if other is not spec and (spec.torch_op is not None or other.torch_op is not None):
            problems.add(
                spec.location.line,
                spec.schema.qualified_name,
                f"op '{name}' is already bound by '{other.python_name}' (line {other.location.line}); "
                "each torch_op names one entry",
            )
