"""The source of a kernel launched dependently (`FusedKernel.dependent_launch`, which
`opgen.runtime.passes.dependent_launch` sets): it waits for the kernel before it, and lets the next one
start, first thing in its body.

`gdc_wait` waits until the kernel launched before this one has finished and its writes are visible;
`gdc_launch_dependents` lets the kernel after this one start. A kernel that waits where it chooses (a
matrix-vector kernel reads its first weights before it waits: `codegen.triton.gemv`) keeps its source.
"""

from __future__ import annotations

WAIT = "tl.extra.cuda.gdc_wait()"
SIGNAL = "tl.extra.cuda.gdc_launch_dependents()"
TOP = (
    f"    {SIGNAL}  # the next kernel may start: it waits for this one\n"
    f"    {WAIT}  # the kernel before this one has finished\n"
)


def waiting(source: str, name: str) -> str:
    """The source of kernel `name` launched dependently: the two calls first in its body, unless it waits
    already (its `def` ends with `):`)."""
    if WAIT in source:
        return source
    head, found, rest = source.partition(f"\ndef {name}(")
    assert found, f"no kernel {name} in its source"
    signature, colon, body = rest.partition("):\n")
    return f"{head}{found}{signature}{colon}{TOP}{body}"
