"""Cats of empty operands: what holds no element is dropped, and a cat left with one operand is a copy.

transformers' Phi-3 (and every model with a partial rotary embedding) rotates the first `rotary_dim`
channels of each head and concatenates the rest back: `cat([rotated, q[..., rotary_dim:]], -1)`. With
the whole head rotated (Phi-3-mini's `partial_rotary_factor` is 1.0) the second operand is empty, and
the cat is an ATen copy kernel in every layer, twice (queries and keys), which the fusion pass cannot
take in (the rotation has a cat of its own). Here an operand of a `cat` with a static meta of no element
is dropped, and a cat left with a single operand becomes `clone` of it: a pointwise copy, which fusion
writes from the kernel that computes the operand. A cat whose operands are all empty stays.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, Sym, TensorMeta
from opgen.runtime.passes.analysis import rewrite_body
from opgen.runtime.registry import KernelRegistry

CAT = "aten.cat.default"


def drop_empty_cat_operands(program: Program, registry: KernelRegistry) -> Program:
    if "clone" not in registry.by_name:
        return program
    return rewrite_body(program, _simplified)


def _simplified(line: Line, metas: dict[str, TensorMeta]) -> Line:
    if not isinstance(line, KernelCall) or line.target != CAT or line.fallback or not line.args:
        return line
    operands = line.args[0]
    if not isinstance(operands, tuple) or len(line.outputs) != 1 or line.outputs[0] is None:
        return line
    kept = tuple(a for a in operands if not _empty(a, metas))
    if len(kept) == len(operands) or not kept:
        return line
    if len(kept) > 1:
        return replace(line, args=(kept, *line.args[1:]))
    out, only = line.outputs[0], kept[0]
    meta = metas.get(only.name) if isinstance(only, Ref) else None
    if meta is None or out.meta is None or meta.shape != out.meta.shape or meta.dtype != out.meta.dtype:
        return replace(line, args=(kept, *line.args[1:]))
    contiguous = (("memory_format", Sym("memory_format", "contiguous_format")),)
    return KernelCall("clone", (only,), contiguous, line.outputs, line.node, "aten.clone.default")


def _empty(arg: Arg, metas: dict[str, TensorMeta]) -> bool:
    meta = metas.get(arg.name) if isinstance(arg, Ref) else None
    return meta is not None and meta.is_static and meta.numel == 0
