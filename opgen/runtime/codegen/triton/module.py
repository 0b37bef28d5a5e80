"""The text of a generated Triton module, as every printer of `opgen.runtime.codegen.triton` writes it.

One `@triton.jit` function, after the helpers it calls. Its name is `<prefix>_<hash>`, the hash of its
meta-parameters and body, which name no graph value: kernels that compute the same thing on the same
sizes (a model's layers) share one name, one source, one compile and one tuning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from opgen.runtime.ir import Config


@dataclass(frozen=True, slots=True)
class Kernel:
    """A printed kernel: its function's name, the module's source, the configs its first call tunes over."""

    name: str
    source: str
    configs: tuple[Config, ...]


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): block sizes cover a size with a power-of-two arange."""
    return 1 << (max(n, 1) - 1).bit_length()


def ieee_dot(out: str, a: str, b: str, dtype: str, indent: int, acc: str = "") -> str:
    """The lines of `out = tl.dot(a, b[, acc])` at `indent`, at full precision where `dtype` (an expression
    resolved when the kernel compiles) is float32: a dot of float32 inputs would use TF32 by default."""
    pad, args = " " * indent, f"{a}, {b}" + (f", {acc}" if acc else "")
    return (f'{pad}if {dtype} == tl.float32:\n{pad}    {out} = tl.dot({args}, input_precision="ieee")\n'
            f"{pad}else:\n{pad}    {out} = tl.dot({args})")  # fmt: skip


def jit_module(prefix: str, params: Sequence[str], meta: str, body: str, helpers: str = "") -> tuple[str, str]:
    """(name, source): `def <name>(<params>, <meta>):` with `body` (indented lines, no trailing newline). The
    name hashes the helpers too: two kernels whose bodies call them alike may differ there (a product kernel
    with and without an epilogue)."""
    name = f"{prefix}_" + hashlib.sha256(f"{meta}\n{body}\n{helpers}".encode()).hexdigest()[:12]
    lines = ["import triton", "import triton.language as tl", "", ""]
    if helpers:
        lines += [helpers, ""]
    lines += ["@triton.jit", f"def {name}({', '.join(params)}, {meta}):", body]
    return name, "\n".join(lines) + "\n"
