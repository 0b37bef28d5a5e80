"""Dependent launch: every generated Triton kernel starts while the kernel before it finishes.

On a GPU, a kernel launched after another starts only once that one has finished: for the small
kernels of a decode step (a few microseconds each) the launch and the ramp of memory traffic at
each start cost as much as a fifth of the step. With programmatic dependent launch (compute
capability 9.0 and newer) a kernel may start as soon as every program of the one before it has
started: it then waits for that kernel (`gdc_wait`: finished, its writes visible) before it reads or
writes anything, and tells the next one it may start (`gdc_launch_dependents`). A kernel that has
memory to read that no kernel writes (a matrix-vector kernel's weights) reads it before the wait,
so its loads overlap the previous kernel (the gemv pass asks for that wait itself). The order of
results is unchanged: every kernel still waits for the one before it.

Where `registry.facts.dependent_launch` holds (found once per process), this pass marks every fused
kernel to be launched that way (`FusedKernel.dependent_launch`); its printer then puts the two calls
at the top of each kernel that has no wait of its own (`opgen.runtime.codegen.triton.dependent_launch`).
ATen's kernels launch as before.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Program
from opgen.runtime.registry import KernelRegistry


def launch_dependently(program: Program, registry: KernelRegistry) -> Program:
    if not registry.facts.dependent_launch or not program.fused:
        return program
    fused = tuple(spec if spec.dependent_launch else replace(spec, dependent_launch=True) for spec in program.fused)
    return replace(program, fused=fused)
