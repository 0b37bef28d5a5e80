"""Whether the Triton printer can write a group's kernel, decided from the op rules (`opgen.runtime.ir.fusible`)
before anything is printed: the fusion pass leaves a group it cannot write to ATen, with a note saying why.

The walk follows the printer's (`opgen.runtime.codegen.triton.groups`): the steps in order, a cat's
branches inside it, each value in the register type the printer holds it in, so that the first node
found here is the one the printer would stop at.
"""

from __future__ import annotations

from typing import Any

from opgen.runtime.ir import FusedGroup, Ref, Step, Tensor, flat_steps
from opgen.runtime.ir.fusible import CAT, ROW_OPS, Register, accepts, compute_type, row_fits


def unwritable(group: FusedGroup) -> str | None:
    """Why the group's kernel cannot be written (its first node without Triton code), or None."""
    tensors = {t.name: t for t in (*group.inputs, *(t for s in flat_steps(group.steps) for t in s.outputs if t))}
    return _Walk(group, tensors).steps(group.steps, top=True)


class _Walk:
    def __init__(self, group: FusedGroup, tensors: dict[str, Tensor]) -> None:
        self.group, self.tensors = group, tensors
        self.ctypes: dict[str, str] = {}  # values computed so far -> the register type they are held in

    def ctype(self, name: str) -> str:
        """A computed value's register type, or a loaded one's (an input, or a value a cat's branch reads)."""
        return self.ctypes.get(name) or compute_type(self.tensors[name].meta.dtype)

    def steps(self, steps: tuple[Step, ...], top: bool) -> str | None:
        for step in steps:
            problem = self.step(step, top)
            if problem is not None:
                return problem
        return None

    def step(self, step: Step, top: bool) -> str | None:
        outs = [t for t in step.outputs if t is not None]
        if step.target == CAT:
            if self.group.kind != "pointwise" or not top:
                return f"node '{step.node}': a cat only fuses at the top of a pointwise kernel"
            for branch in step.branches:
                problem = self.steps(branch, top=False)
                if problem is not None:
                    return problem
            self.ctypes[outs[0].name] = compute_type(outs[0].meta.dtype)
            return None
        values: dict[str, Any] = {k: Register(self.ctype(v.name)) if isinstance(v, Ref) else v for k, v in step.values}
        if step.target in ROW_OPS:
            return self.row(step, values, outs)
        if not accepts(step.target, values, outs[0].meta.dtype):
            return f"node '{step.node}' ({step.target}): no Triton expression for these arguments"
        self.ctypes[outs[0].name] = compute_type(outs[0].meta.dtype)
        return None

    def row(self, step: Step, values: dict[str, Any], outs: list[Tensor]) -> str | None:
        if step.target == "aten.native_layer_norm.default":  # all three outputs in the input's float type
            held = "float64" if values["input"].ctype == "float64" else "float32"
            self.ctypes.update((t.name, held) for t in step.outputs if t is not None)
            return None
        ctype = compute_type(outs[0].meta.dtype)
        if not row_fits(step.target, ctype):
            return f"node '{step.node}': amax/amin of {outs[0].meta.dtype} is left to ATen"
        self.ctypes[outs[0].name] = ctype
        return None
