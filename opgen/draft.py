"""`python -m opgen.draft [--import MODULE]... NAMESPACE...`: spec entries drafted from the `torch.library`
ops a process registers, for the user to fill in their kernels.

Import the modules that register the ops (`--import my_ops.ops`, or ops registered by loading a shared
library those modules load), name their namespaces, and get one entry per op overload, in the op's own
schema, with `torch_op` naming it and a guessed kernel and header to replace:

    - func: scaled_add(Tensor a, Tensor b, float alpha=1.) -> Tensor
      kernels: {cpu: mylib::scaled_add}   # your C++ function (cuda: too, where it has one)
      includes: [mylib/scaled_add.h]      # the header that declares it
      torch_op: mylib::scaled_add

Each entry is checked with the spec's own validation as it is drafted: one the spec cannot bind yet is
written commented out, under the problems the validation found. Needs torch (the generator does not:
this is a separate command).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from opgen.spec.loader import SpecError
from opgen.spec.validate import load_spec


def registered_ops(namespaces: Iterable[str]) -> list[tuple[str, str, str]]:
    """(namespace, name, overload) of every op overload registered under `namespaces`, sorted."""
    import torch

    wanted = tuple(f"{ns}::" for ns in namespaces)
    found = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if qualified.startswith(wanted):
            ns, _, rest = qualified.partition("::")
            name, _, overload = rest.partition(".")
            found.append((ns, name, overload))
    return sorted(found)


def schema_text(ns: str, name: str, overload: str) -> str:
    """The op's schema without its namespace: `scaled_add(Tensor a, Tensor b, float alpha=1.) -> Tensor`."""
    import torch

    return str(torch._C._get_schema(f"{ns}::{name}", overload)).removeprefix(f"{ns}::")


def entry_text(ns: str, name: str, overload: str, schema: str) -> str:
    """A spec entry for one op overload, with a guessed kernel and header."""
    op = f"{ns}::{name}" + (f".{overload}" if overload else "")
    return (
        f"- func: {schema}\n"
        f"  kernels: {{cpu: {ns}::{name}}}   # your C++ function (cuda: too, where it has one)\n"
        f"  includes: [{ns}/{name}.h]   # the header that declares it\n"
        f"  torch_op: {op}\n"
    )


def problems_of(entry: str) -> list[str]:
    """What the spec's validation says of one entry (nothing where it can be bound)."""
    with tempfile.TemporaryDirectory(prefix="opgen-draft-") as tmp:
        path = Path(tmp) / "draft.yaml"
        path.write_text(entry)
        try:
            load_spec(path, "draft.yaml")
        except SpecError as exc:
            return [p.removeprefix("draft.yaml:1: ") for p in exc.problems]
    return []


def draft(namespaces: Sequence[str]) -> str:
    """The spec text for every op registered under `namespaces`."""
    ops = registered_ops(namespaces)
    if not ops:
        raise SystemExit(
            f"opgen.draft: no ops registered under {', '.join(namespaces)} in this process "
            "(import the module that registers them: --import MODULE)"
        )
    parts = [f"# Drafted by `python -m opgen.draft {' '.join(namespaces)}`: replace each kernel and header.\n"]
    for ns, name, overload in ops:
        entry = entry_text(ns, name, overload, schema_text(ns, name, overload))
        problems = problems_of(entry)
        if problems:
            notes = "".join(f"# not bindable yet: {p}\n" for p in problems)
            entry = notes + "".join(f"# {line}\n" for line in entry.splitlines())
        parts.append(entry)
    return "\n".join(parts)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.draft", description=__doc__.split("\n\n")[0])
    parser.add_argument("namespaces", nargs="+", help="torch.library namespaces (mylib for torch.ops.mylib)")
    parser.add_argument("--import", dest="modules", action="append", default=[], help="a module that registers ops")
    parser.add_argument("-o", "--output", type=Path, help="write the spec here (default: standard output)")
    args = parser.parse_args(argv)
    import torch  # noqa: F401 - the registry of ops the modules add to

    for module in args.modules:
        importlib.import_module(module)
    text = draft(args.namespaces)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
        print(f"opgen.draft: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
