"""Dependent launch: every generated Triton kernel starts while the kernel before it finishes.

On a GPU, a kernel launched after another starts only once that one has finished: for the small
kernels of a decode step (a few microseconds each) the launch and the ramp of memory traffic at
each start cost as much as a fifth of the step. With programmatic dependent launch (compute
capability 9.0 and newer) a kernel may start as soon as every program of the one before it has
started: it then waits for that kernel (`gdc_wait`: finished, its writes visible) before it reads or
writes anything, and tells the next one it may start (`gdc_launch_dependents`). A kernel that has
memory to read that no kernel writes (a matrix-vector kernel's weights) reads it before the wait,
so its loads overlap the previous kernel (`gemv_triton` places that wait itself). The order of
results is unchanged: every kernel still waits for the one before it.

Where `registry.facts.dependent_launch` holds (found once per process), this pass puts the two calls
at the top of each fused kernel that has no wait of its own and marks every kernel to be launched
that way (`FusedKernel.dependent_launch`). ATen's kernels launch as before.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.registry import KernelRegistry

WAIT = "tl.extra.cuda.gdc_wait()"
SIGNAL = "tl.extra.cuda.gdc_launch_dependents()"
TOP = (
    f"    {SIGNAL}  # the next kernel may start: it waits for this one\n"
    f"    {WAIT}  # the kernel before this one has finished\n"
)


def launch_dependently(program: Program, registry: KernelRegistry) -> Program:
    if not registry.facts.dependent_launch or not program.fused:
        return program
    return replace(program, fused=tuple(_dependent(f) for f in program.fused))


def _dependent(spec: FusedKernel) -> FusedKernel:
    if spec.dependent_launch:
        return spec
    source = spec.source if WAIT in spec.source else _wait_at_top(spec.source, spec.name)
    return replace(spec, source=source, dependent_launch=True)


def _wait_at_top(source: str, name: str) -> str:
    """The source with the two calls first in the kernel's body (its `def` ends with `):`)."""
    head, found, rest = source.partition(f"\ndef {name}(")
    assert found, f"no kernel {name} in its source"
    signature, colon, body = rest.partition("):\n")
    return f"{head}{found}{signature}{colon}{TOP}{body}"
