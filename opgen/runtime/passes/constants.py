"""Constant folding: calls that read only constants run once, in setup, instead of on every call.

Constants are the program's non-mutable tensor constants and whatever setup computes from them
alone. Persistent buffers are not constants (their contents change per call), so this pass is
safe in any position of the pipeline. Random ops (`randn`, `bernoulli`, ...) are never folded:
each call draws anew. Values that escape to the caller are never hoisted: graph
outputs stay fresh tensors. Nor is anything sharing storage with a value the body writes (a Triton
kernel writing into a buffer computed from constants alone): its contents change per call too.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Program, defs, uses
from opgen.runtime.passes.analysis import body_written, constant_names, escaping
from opgen.runtime.registry import KernelRegistry


def _foldable(line: Line, constant: set[str], escapes: set[str]) -> bool:
    if not isinstance(line, KernelCall) or line.fallback or line.mutates or line.seeded or not line.outputs:
        return False
    return set(uses(line)) <= constant and not {v.name for v in defs(line)} & escapes


def fold_constants(program: Program, registry: KernelRegistry) -> Program:
    constant = constant_names(program)
    escapes = escaping(program, registry) | body_written(program, registry)
    setup, body = list(program.setup), []
    for line in program.body:
        if _foldable(line, constant, escapes):
            setup.append(line)
            constant.update(v.name for v in defs(line))
        else:
            body.append(line)
    return replace(program, setup=tuple(setup), body=tuple(body))
