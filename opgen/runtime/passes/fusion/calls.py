"""Putting generated kernels into a program, for the fusion and gemv passes alike: each kernel's
member lines leave the body and one call of the kernel takes the place of one of them. A pass that
merges generated kernels (`gemv_prologue`, `horizontal`) drops the ones it absorbed (`absorbing`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from opgen.runtime.ir import FusedKernel, KernelCall, Line, Program, Ref


def fused_call(spec: FusedKernel) -> KernelCall:
    """The body's call of a fused kernel: its inputs in, its fresh outputs out, its `writes` written."""
    return KernelCall(
        spec.local,
        tuple(Ref(n) for n in spec.inputs),
        (),
        spec.outputs,
        node=", ".join(spec.nodes),
        target=spec.target,  # named after the kernel once it is printed (`codegen.triton.kernels`)
        unpack=len(spec.outputs) > 1,
        mutates=tuple(v.name for v in spec.writes),
        jit=True,
    )


def place(program: Program, kernels: Sequence[tuple[FusedKernel, Collection[int], int]]) -> Program:
    """`program` with each (kernel, body indices of its members, index its call goes to) applied."""
    if not kernels:
        return program
    replaced: dict[int, Line | None] = {}
    for spec, members, at in kernels:
        replaced.update(dict.fromkeys(members))
        replaced[at] = fused_call(spec)
    body = tuple(new for index, line in enumerate(program.body) if (new := replaced.get(index, line)) is not None)
    return replace(program, body=body, fused=(*program.fused, *(spec for spec, _, _ in kernels)))


def absorbing(program: Program, kernels: Sequence[tuple[FusedKernel, Collection[int], int]],
              absorbed: Collection[str]) -> Program:  # fmt: skip
    """`place`, the program's fused kernels named in `absorbed` (their `local`s) dropped: the new kernels'
    member lines include their calls."""
    if not kernels:
        return program
    return place(replace(program, fused=tuple(s for s in program.fused if s.local not in absorbed)), kernels)


def called(line: Line, specs: Mapping[str, FusedKernel]) -> FusedKernel | None:
    """The generated kernel `line` calls (`specs`: the program's, by `local`), or None."""
    if isinstance(line, KernelCall) and line.jit:
        return specs.get(line.kernel)
    return None
