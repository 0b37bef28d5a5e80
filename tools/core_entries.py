"""Draft ops.yaml entries for ATen op overloads, from torch's own native_functions.yaml.

Used to write the core-opset section of ops.yaml: `python tools/core_entries.py add.Tensor ...`
prints one entry per functional overload with its kernels chosen as PyTorch's AOTInductor shim
does (the backend kernel where ATen has one, else the composite one) and its in-place and out
variants where ATen has them. The output is a draft to review: docs and names are checked by
`python -m opgen check` and the tests, not trusted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torchgen
from torchgen.gen import parse_native_yaml
from torchgen.model import DispatchKey, NativeFunction, SchemaKind

_NATIVE = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native"
_COMPOSITES = (
    (DispatchKey.CompositeExplicitAutogradNonFunctional, "compositeexplicitautogradnonfunctional"),
    (DispatchKey.CompositeExplicitAutograd, "compositeexplicitautograd"),
    (DispatchKey.CompositeImplicitAutograd, "compositeimplicitautograd"),
)


def _has(f: NativeFunction, index: dict, key: DispatchKey, by_name: dict) -> bool:
    backend = index.get(key)
    if backend is None:
        return False
    if backend.has_kernel(f):
        return True
    delegate = f.structured_delegate
    return delegate is not None and backend.has_kernel(by_name[str(delegate)])


def kernels(f: NativeFunction, index: dict, outf: bool, by_name: dict) -> dict[str, str]:
    name = str(f.func.name.name)
    suffix = "_outf" if outf else ""
    found: dict[str, str] = {}
    for key, ns in ((DispatchKey.CPU, "cpu"), (DispatchKey.CUDA, "cuda")):
        if _has(f, index, key, by_name):
            found[ns] = f"at::{ns}::{name}{suffix}"
    if not found:
        for key, ns in _COMPOSITES:
            if _has(f, index, key, by_name):
                return {"default": f"at::{ns}::{name}{suffix}"}
    return found


def _out_variant(f: NativeFunction, by_name: dict) -> NativeFunction | None:
    for g in by_name.values():
        if (
            g.func.name.name.base == f.func.name.name.base
            and g.func.kind() == SchemaKind.out
            and g.func.signature() == f.func.signature()
        ):
            return g
    return None


def main(names: list[str]) -> None:
    parsed = parse_native_yaml(str(_NATIVE / "native_functions.yaml"), str(_NATIVE / "tags.yaml"))
    index = parsed.backend_indices
    by_name = {str(f.func.name): f for f in parsed.native_functions}
    for wanted in names:
        f = by_name[wanted.removesuffix(".default")]
        print(f"- func: {f.func}")
        ks = kernels(f, index, False, by_name)
        print("  kernels: {" + ", ".join(f"{k}: {v}" for k, v in ks.items()) + "}")
        base = f.func.name.name
        inplace = f"{base.base}_" + (f".{f.func.name.overload_name}" if f.func.name.overload_name else "")
        if inplace in by_name:
            ik = kernels(by_name[inplace], index, False, by_name)
            if ik and ik != {k: v.replace(str(base), str(base) + "_") for k, v in ks.items()}:
                print(
                    f"  inplace: {{func: {inplace}, kernels: {{" + ", ".join(f"{k}: {v}" for k, v in ik.items()) + "}}"
                )
            elif ik:
                print(f"  inplace: {inplace}")
        out = _out_variant(f, by_name)
        if out is not None:
            ok = kernels(out, index, True, by_name)
            func = str(out.func.name) if len(f.func.returns) == 1 else str(out.func)
            if ok:
                print(f"  out: {{func: '{func}', kernels: {{" + ", ".join(f"{k}: {v}" for k, v in ok.items()) + "}}")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
