"""Putting generated kernels into a program, for the fusion and gemv passes alike: each kernel's
member lines leave the body and one call of the kernel takes the place of one of them. A pass that
merges generated kernels (`gemv_prologue`, `horizontal`, `attention_writes`, `attention_prologue`) drops
the ones it absorbed (`absorbing`); one that merges a kernel with another found from it, pair by pair,
walks the body with `merging`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from opgen.runtime.ir import FusedGroup, FusedKernel, HorizontalPlan, KernelCall, Line, Program, Ref
from opgen.runtime.passes.analysis import writes_memory


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


def launched_groups(spec: FusedKernel) -> tuple[FusedGroup, ...]:
    """The fusion groups a generated kernel runs: its one, or `horizontal`'s several; () for any other kernel."""
    plan = spec.plan
    if isinstance(plan, HorizontalPlan):
        return plan.parts
    return (plan,) if isinstance(plan, FusedGroup) else ()


def writes_in_place(line: Line, specs: Mapping[str, FusedKernel]) -> bool:
    """`writes_memory`, knowing what a generated kernel writes: a call of one that writes no input in place
    (a pointwise kernel, an attention) writes its fresh outputs alone."""
    kernel = called(line, specs)
    return bool(kernel.writes) if kernel is not None else writes_memory(line)


# What a merging pass finds from one generated kernel's call (`merging`): the merged kernel, the body
# indices of its member lines, the index its call goes to, and the `local`s of the kernels it absorbs.
Merge = tuple[FusedKernel, Collection[int], int, Collection[str]]


def merging(program: Program, find: Callable[[int, FusedKernel, Mapping[str, FusedKernel]], Merge | None]) -> Program:
    """`program` with each merge `find(body index, kernel called there, the program's kernels)` returns
    applied, in body order; a kernel takes part in one merge at most."""
    specs = {spec.local: spec for spec in program.fused}
    found: list[tuple[FusedKernel, Collection[int], int]] = []
    gone: set[str] = set()
    for at, line in enumerate(program.body):
        spec = called(line, specs)
        if spec is None or spec.local in gone:
            continue
        merge = find(at, spec, specs)
        if merge is None or gone & set(merge[3]):
            continue
        kernel, members, place_at, absorbed = merge
        gone |= set(absorbed)
        found.append((kernel, members, place_at))
    return absorbing(program, found, gone)
