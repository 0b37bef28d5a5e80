"""`python -m opgen.demo`: the main job in one screen: spec -> generated bindings -> direct kernel calls.

Run after the build (`make demo` does both). Regenerates the bindings from ops.yaml in memory to
show what the build compiled, calls a few kernels and queries the registry.
"""

from __future__ import annotations

from pathlib import Path

import torch

from opgen import kernel_ops
from opgen.gen.emit import emit
from opgen.spec.validate import load_spec

SPEC = Path(__file__).resolve().parent.parent / "ops.yaml"


def show_generation() -> None:
    ops = load_spec(SPEC)
    files = emit(ops, SPEC.name)
    print(f"1. {SPEC.name}: {len(ops)} bound functions -> {', '.join(files)}")
    print(f"   the built module's BUILD_ID is {kernel_ops.BUILD_ID}")
    shard = next(text for name, text in files.items() if "kernel_ops_add(" in text)
    start = shard.index("// ops.yaml:", shard.index("kernel_ops_add(") - 200)
    print("   generated binding for add.Tensor:\n")
    print("   " + shard[start : shard.index("\n}\n", start) + 2].replace("\n", "\n   "))


def show_calls() -> None:
    a, b = torch.arange(4.0), torch.ones(4)
    print("2. direct kernel calls")
    print(f"   kernel_ops.add(a, b, alpha=2)  = {kernel_ops.add(a, b, alpha=2)}")
    out = torch.empty(4)
    print(f"   kernel_ops.add_out(a, b, out=out) is out: {kernel_ops.add_out(a, b, out=out) is out}")
    print(f"   kernel_ops.add_(a, b) is a: {kernel_ops.add_(a, b) is a}; a = {a}")
    try:
        kernel_ops.add(a, "b")
    except TypeError as exc:
        print(f"   bad call -> TypeError: {exc}")


def show_registry() -> None:
    info = kernel_ops.get_kernel_op_info("add")
    print("3. the args-info registry")
    print(f"   {len(kernel_ops.get_kernel_ops_args_info())} functions; add: {info['schema']}")
    for arg in info["args"]:
        default = f", default={arg['default']!r}" if "default" in arg else ""
        print(f"     {arg['name']:6s} {arg['type']:7s} kind={arg['kind']}{default}, kwarg_only={arg['kwarg_only']}")
    print(f"   variants: inplace={info['inplace']!r} out={info['out']!r}; backends={info['backends']}")
    try:
        kernel_ops.get_kernel_op_info("ad")
    except KeyError as exc:
        print(f"   unknown name -> KeyError: {exc}")


if __name__ == "__main__":
    show_generation()
    print()
    show_calls()
    print()
    show_registry()
