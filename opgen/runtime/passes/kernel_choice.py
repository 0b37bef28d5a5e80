"""The multi-kernel choice: nodes that several kernel_ops functions can compute get all of them.

A spec Triton op declares the ATen overload it computes (`candidate_for`) and what its inputs must
look like (contiguous, one shape). Where a CUDA node of that overload meets those conditions, its
call goes to a `KernelChoice` instead: bound at load time to `opgen.jit.choice.Choice`, which times
the ATen binding and the candidates on the first call with real inputs, keeps the fastest (stored
in the JIT cache) and from then on forwards to it from C++. `report()` says which one runs and why.
Optional; GPU-only in effect (the candidates are CUDA kernels), and left out of the default
pipeline where the JIT cannot run.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import KernelCall, KernelChoice, Line, Program, Ref, TensorMeta
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.registry import KernelRegistry, OpInfo, bind


def _metas(program: Program) -> dict[str, TensorMeta]:
    metas = {i.name: i.meta for i in program.inputs} | {c.name: c.meta for c in program.constants}
    for line in (*program.setup, *program.body):
        if isinstance(line, KernelCall):
            metas.update({v.name: v.meta for v in line.outputs if v is not None and v.meta is not None})
    return metas


def _fits(candidate: OpInfo, info: OpInfo, line: KernelCall, metas: dict[str, TensorMeta]) -> bool:
    if [(a.name, a.type) for a in candidate.args] != [(a.name, a.type) for a in info.args]:
        return False
    values = bind(info, line.args, dict(line.kwargs))
    tensors = {name: metas.get(v.name) for name, v in values.items() if isinstance(v, Ref)}
    if not tensors or any(m is None or not m.device.startswith("cuda") for m in tensors.values()):
        return False
    if any(not tensors[n].is_contiguous() for n in candidate.contiguous if n in tensors):  # type: ignore[union-attr]
        return False
    shapes = {tensors[n].shape for n in candidate.same_shape if n in tensors}  # type: ignore[union-attr]
    return len(shapes) <= 1 and all(n in tensors for n in (*candidate.contiguous, *candidate.same_shape))


def choose_kernels(program: Program, registry: KernelRegistry) -> Program:
    metas = _metas(program)
    names = fresh_namer(program, "choice")
    body: list[Line] = []
    choices: list[KernelChoice] = []
    for line in program.body:
        info = registry.by_name.get(line.kernel) if isinstance(line, KernelCall) and not line.fallback else None
        if info is None or line.jit or line.mutates or not line.outputs:  # type: ignore[union-attr]
            body.append(line)
            continue
        assert isinstance(line, KernelCall)
        fitting = [c.name for c in registry.candidates(info.aten) if _fits(c, info, line, metas)]
        if not fitting:
            body.append(line)
            continue
        local = next(names)
        choices.append(KernelChoice(local, (info.name, *fitting), line.node, line.target))
        body.append(replace(line, kernel=local, jit=True))
    return replace(program, body=tuple(body), choices=(*program.choices, *choices))
