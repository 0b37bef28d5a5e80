"""The profiled twin of a generated function: the same body, each kernel call in a profiler range.

opgen's kernels bypass the dispatcher, so a profiler sees none of them by itself. The Python backend
therefore prints every graph's function twice inside one `make`: the plain function, whose first
statement hands the call to its twin while a profiler is on, and the twin `<name>_profiled`, which
runs the whole call in one range named after the graph and each kernel call in a range named after
its graph node and op, as eager's ops show up:

    def forward(x):
        if _profiler._is_profiler_enabled:  # a profiler is on: run the copy below, in profiler ranges
            return forward_profiled(x)
        ...
        buf0 = convolution(x, p_w, ...)  # conv2d: aten.convolution.default

    def forward_profiled(x):  # forward, each kernel call in a profiler range (runs while a profiler is on)
        with _record("opgen::forward (MyNet, graph 0123456789abcdef)"):
            ...
            with _record("opgen::conv2d (aten.convolution.default)"):
                buf0 = convolution(x, p_w, ...)  # conv2d: aten.convolution.default

Both functions share one closure (constants, persistent buffers, the size memo, the input check), so
the twin costs nothing but its text and is correct whenever the plain one is. The check is one read
of a Python flag that torch's profilers set (`torch.autograd.profiler._is_profiler_enabled`, as
Inductor's Triton launcher and Dynamo read it); the executor binds `_profiler` and `_record` (a
record_function range) from its runtime. This module is text only: no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from opgen.runtime.ir import KernelCall

HELPERS = ("_profiler", "_record")  # what the twin and the check bind from the executor's runtime
INDENT = "    "


def twin_name(name: str) -> str:
    """The profiled twin of function `name`."""
    return f"{name}_profiled"


def range_name(line: KernelCall) -> str:
    """The event a kernel call shows as: `opgen::conv2d (aten.convolution.default)`."""
    return f"opgen::{line.node} ({line.target})"


def graph_range_name(name: str, header: str = "") -> str:
    """The event one call of the whole graph shows as: `opgen::forward (MyNet, graph 0123456789abcdef)`."""
    return f"opgen::{name}" + (f" ({header})" if header else "")


def in_range(text: Sequence[str], name: str) -> list[str]:
    """Statements (unindented) run inside a profiler range called `name`."""
    return [f"with _record({json.dumps(name)}):", *(INDENT + t for t in text)]


def dispatch_text(name: str, args: str) -> list[str]:
    """The plain function's first statement: while a profiler is on, the twin runs the call."""
    return [
        "if _profiler._is_profiler_enabled:  # a profiler is on: run the copy below, in profiler ranges",
        f"    return {twin_name(name)}({args})",
    ]


def twin_header(name: str, args: str) -> str:
    """The twin's `def` line (unindented)."""
    return (
        f"def {twin_name(name)}({args}):  # {name}, each kernel call in a profiler range (runs while a profiler is on)"
    )
