"""Which ATen kernels exist: read from the dispatch headers of the torch the build compiles against.

A kernel the spec names (`at::cpu::add_outf`) must be declared in its header
(`ATen/ops/add_cpu_dispatch.h`) with as many parameters as the schema has arguments, since the
binding passes them all in schema order; otherwise the spec would give C++ that fails in the
compiler, far from the YAML line at fault. The headers are found without importing torch (the
generator must not): through the import system's spec of the `torch` package. Where no torch is
installed, nothing is checked. opgen's own kernels (`opgen::kernels::<function>`) are checked the
same way against opgen's own header, `csrc/opgen/kernels/kernels.h`, whose declarations start `OPGEN_KERNEL`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from opgen.spec.model import OWN_HEADER, Kernel

_DECLARATION = re.compile(r"^(?:TORCH_API|OPGEN_KERNEL)\s[^(]*?\b(?P<fn>\w+)\((?P<params>.*)\);\s*$")


def own_header() -> Path:
    """opgen's kernels.h: under the installed package (`opgen/csrc`) or the source tree (`csrc`)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "csrc" / OWN_HEADER
    return installed if installed.is_file() else package.parent / "csrc" / OWN_HEADER


def torch_include_dir() -> Path | None:
    """`<site-packages>/torch/include`, or OPGEN_TORCH_INCLUDE; None if there is no torch."""
    override = os.environ.get("OPGEN_TORCH_INCLUDE")
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    for location in locations:
        include = Path(location) / "include"
        if (include / "ATen" / "ops").is_dir():
            return include
    return None


def count_params(params: str) -> int:
    """Top-level commas + 1 (templates and default values may hold commas of their own)."""
    if not params.strip():
        return 0
    depth, count = 0, 1
    for ch in params:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == "," and depth == 0:
            count += 1
    return count


@dataclass
class KernelIndex:
    """The kernels declared under one include directory, read header by header as asked."""

    include: Path
    _headers: dict[str, dict[str, set[int]] | None] = field(default_factory=dict)

    @classmethod
    def find(cls) -> KernelIndex | None:
        include = torch_include_dir()
        return cls(include) if include is not None else None

    def declarations(self, header: str) -> dict[str, set[int]] | None:
        """{function: its parameter counts} for one header; None if the header does not exist."""
        if header not in self._headers:
            path = own_header() if header == OWN_HEADER else self.include / header
            if not path.is_file():
                self._headers[header] = None
            else:
                found: dict[str, set[int]] = {}
                for line in path.read_text(errors="replace").splitlines():
                    match = _DECLARATION.match(line)
                    if match:
                        found.setdefault(match["fn"], set()).add(count_params(match["params"]))
                self._headers[header] = found
        return self._headers[header]

    def problem(self, kernel: Kernel, arg_count: int) -> str | None:
        """Why the binding's call `kernel(<arg_count arguments>)` would not compile, or None."""
        declared = self.declarations(kernel.header)
        name = kernel.qualified_name
        if declared is None:
            return f"{kernel.backend} kernel '{name}': torch has no header {kernel.header}, so no such kernel"
        counts = declared.get(kernel.function)
        if counts is None:
            close = ", ".join(sorted(declared)[:6])
            return f"{kernel.backend} kernel '{name}' is not declared in {kernel.header} (it declares: {close})"
        if arg_count not in counts:
            want = " or ".join(str(c) for c in sorted(counts))
            return f"{kernel.backend} kernel '{name}' takes {want} arguments, but the schema has {arg_count}"
        return None
