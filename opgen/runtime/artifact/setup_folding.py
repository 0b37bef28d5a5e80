"""Setup folding for packages: setup lines that compute from the weights alone, run once when the
package is written, their results stored as constants, so that loading it runs less.

An executor program's setup lines run when it is bound: batch norm folded into the convolution
weights (`mul`, `sub`, `rsqrt` of the weights and statistics), oneDNN weight packing (`op` lines),
persistent buffers (`empty_strided`) and their views. In a package, the kernel calls among them
(thunks, `<fn>.<backend>`) that read only constants, literals and other such calls' results give the
same tensors on every load: `fold` keeps those results as constants instead, and drops the constants
only they read. oneDNN's packing stays a setup line (its blocked layout belongs to the CPU that loads
the package), as do buffers.

A result that shares storage with a constant (a view of a weight) is not folded: the body may write
the constant (a buffer), and the view must see it. A setup that writes in place (a call with no
results) is left as it is. Plain text and values: the caller
(`frontend/packaging.py`) runs the setup (`_C.setup_values`) and says which values can be stored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_STATIC = re.compile(r"s(\d+)(,?)")
_THUNK = re.compile(r"[A-Za-z_]\w*\.\w+")  # add.cpu, mul.cuda, view.default


@dataclass(frozen=True, slots=True)
class Folded:
    """The program with folded setup lines replaced by constants, and what each constant line binds, in
    order: (key, value), an original constant or a folded result (key `setup.s<k>`)."""

    program: str
    constants: tuple[tuple[str, Any], ...]


def _split(line: str) -> tuple[str, str]:
    """An instruction and its comment (`#` never appears escaped: codegen.cpp_literals.escape)."""
    code, hash_, comment = line.partition("#")
    return code.rstrip(), ("  " + hash_ + comment if hash_ else "")


def _statics(words: Sequence[str]) -> list[int]:
    return [int(m.group(1)) for w in words if (m := _STATIC.fullmatch(w))]


def fold(
    program: str,
    values: Sequence[Any],
    storable: Callable[[Any], bool],
    shares_storage: Callable[[Any, Any], bool],
) -> Folded:
    """Fold `program`'s constant-only setup calls. `values[k]` is static s<k> after setup (None where it
    is not a tensor); `storable(v)` says whether a package can hold it; `shares_storage(a, b)` whether
    two tensors alias."""
    lines = program.splitlines()
    setup_at, body_at = lines.index("setup:"), lines.index("body:")
    setup = lines[setup_at + 1 : body_at]
    keys: dict[int, str] = {}
    for line in lines[:setup_at]:
        words = line.split()
        if words[:1] == ["constant"]:
            keys[_statics(words[1:2])[0]] = words[2]
    constants = [values[k] for k in keys]
    if any(" = " not in _split(line)[0] for line in setup if _split(line)[0].strip()):
        return Folded(program, tuple((key, values[k]) for k, key in keys.items()))  # writes in place
    folded: set[int] = set()
    kept_setup: list[str] = []
    kept_outs: set[int] = set()  # statics the kept setup lines make
    for line in setup:
        code, _ = _split(line)
        outs_text, _, call = code.partition(" = ")
        words = call.split()
        outs = _statics(outs_text.split())
        reads = _statics(words[1:])
        if (
            words
            and _THUNK.fullmatch(words[0])
            and all(k in keys or k in folded for k in reads)
            and all(values[k] is not None and storable(values[k]) for k in outs)
            and not any(shares_storage(values[k], c) for k in outs for c in constants)
        ):
            folded.update(outs)
        else:
            kept_setup.append(line)
            kept_outs.update(outs)
    body = lines[body_at + 1 :]
    read = {k for line in kept_setup + body for k in _statics(_split(line)[0].split())}
    stored = [k for k in sorted(keys) if k in read] + sorted(k for k in folded if k in read)
    number = {k: i for i, k in enumerate(stored + sorted(kept_outs))}

    def renamed(line: str) -> str:
        code, comment = _split(line)
        indent = code[: len(code) - len(code.lstrip())]
        words = [f"s{number[int(m.group(1))]}{m.group(2)}" if (m := _STATIC.fullmatch(w)) else w for w in code.split()]
        return indent + " ".join(words) + comment

    out: list[str] = []
    for line in lines[:setup_at]:
        words = line.split()
        if words[:1] == ["program"] and len(words) == 6:
            words[5] = str(len(number))
            out.append(" ".join(words))
        elif words[:1] not in (["constant"], ["shared"]):  # a package has no Python function to share with
            out.append(line)
    bound = tuple((keys.get(k, f"setup.s{k}"), values[k]) for k in stored)
    out += [f"constant s{i} {key}" for i, (key, _) in enumerate(bound)]
    out += ["setup:", *(renamed(line) for line in kept_setup), "body:", *(renamed(line) for line in body)]
    return Folded("\n".join(out) + ("\n" if program.endswith("\n") else ""), bound)
