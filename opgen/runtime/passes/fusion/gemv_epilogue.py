"""Activations as the epilogue of the products before them: a pointwise kernel whose input is a product
kernel's output, read by nothing else, becomes that kernel's last step.

A GPT-2 layer multiplies its normed row by `c_fc`'s weight and applies `gelu_new` (eight pointwise ops, one
`fusion` kernel) before `c_proj`: at batch 1 the product is a matrix-vector kernel and the activation a
launch of its own, whose input makes a trip through memory. Here the product kernel computes the group at
the product's elements in registers (`codegen.triton.gemv_epilogue`) and stores the group's output alone.
Any pointwise group of one output fits (an activation, a bias, a scale, a residual add: its other inputs
are read at the same elements), after any product kernel of one product that is not a gated pair's (one
row, with or without a norm as its prologue, or a few rows). A lone pointwise op (`relu`, `gelu`: `fusion`
leaves one op to ATen) that would fit is made a group's kernel first (`lone_activations`), so it fits too.

It applies where the product's output reaches the group only through views and nothing else reads it or
them, the group reads it contiguously at the group's own elements (the same shape, row-major) and stores
its output row-major, the group's other inputs exist before the product kernel runs, and the lines
between the two write no memory (the merged kernel runs where the product did). The merged kernel is one
multi-kernel choice against all the ATen calls the two replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from opgen.runtime.ir import FusedGroup, FusedKernel, GemvPlan, KernelCall, Line, Program, Ref
from opgen.runtime.passes.analysis import RESHAPES, defined_at, fresh_namer, readers, writes_memory
from opgen.runtime.passes.fusion.calls import Merge, called, merging, place, writes_in_place
from opgen.runtime.passes.fusion.expressible import unwritable
from opgen.runtime.passes.fusion.groups import find_groups
from opgen.runtime.passes.fusion.rewrite import group_kernel
from opgen.runtime.registry import KernelRegistry


def fuse_gemv_epilogue(program: Program, registry: KernelRegistry) -> Program:
    if not any(isinstance(spec.plan, GemvPlan) for spec in program.fused):
        return program  # no product kernel: nothing to end with a group
    program = lone_activations(program, registry)
    body = program.body
    producers, read_by = defined_at(body), readers(body)

    def find(at: int, spec: FusedKernel, specs: Mapping[str, FusedKernel]) -> Merge | None:
        if (taken := _taker(spec, at, body, specs, producers, read_by)) is None:
            return None
        given, gemv_at, views = taken
        gemv = specs[body[gemv_at].kernel]  # type: ignore[union-attr]
        kernel = merged(gemv, spec, given, [body[i] for i in views])
        return kernel, (gemv_at, *views, at), gemv_at, (gemv.local, spec.local)

    return merging(program, find)


def lone_activations(program: Program, registry: KernelRegistry) -> Program:
    """`program` with each lone pointwise call (`relu(fc(x))`: one op, which `fusion` leaves to ATen) that
    would be a product kernel's epilogue made a kernel of its own, for the merge to take."""
    body, specs = program.body, {spec.local: spec for spec in program.fused}
    producers, read_by = defined_at(body), readers(body)
    locals_, placed = fresh_namer(program, "fused"), []
    for found in find_groups(program, registry, singles=True):
        at = found.members[-1]
        if not found.alone or unwritable(found.group) is not None:
            continue
        spec = group_kernel("", found.group, found.lines)
        if _taker(spec, at, body, specs, producers, read_by) is not None:
            placed.append((replace(spec, local=next(locals_)), found.members, at))
    return place(program, placed)


def _taker(spec: FusedKernel, at: int, body: tuple[Line, ...], specs: Mapping[str, FusedKernel],
           producers: dict[str, int], read_by: dict[str, set[int]]) -> tuple[int, int, list[int]] | None:  # fmt: skip
    """(the group's input that is the product, body index of the product kernel's call, of the views between)
    where the group kernel `spec`, called at `at`, can be that product kernel's epilogue, as the module says;
    else None. The first input that is a product kernel's product decides."""
    group = spec.plan
    if not isinstance(group, FusedGroup) or group.kind != "pointwise" or len(group.outputs) != 1:
        return None
    out = group.outputs[0]
    if out.placement is not None or out.meta is None or not out.meta.is_contiguous():
        return None  # the kernel stores it row-major at the product's elements
    for given, name in enumerate(spec.inputs):
        match = _product(name, at, body, specs, producers, read_by)
        if match is not None:
            gemv_at, views = match
            gemv = specs[body[gemv_at].kernel]  # type: ignore[union-attr]
            fits = _fits(group, given, gemv, spec, gemv_at, at, views, body, specs, producers)
            return (given, gemv_at, views) if fits else None
    return None


def _product(name: str, at: int, body: tuple[Line, ...], specs: Mapping[str, FusedKernel],
             producers: dict[str, int], read_by: dict[str, set[int]]) -> tuple[int, list[int]] | None:  # fmt: skip
    """(body index of the product kernel's call, of the views between) where `name`, read at `at`, is a
    product kernel's product through views that nothing else reads, or None."""
    views: list[int] = []
    reader = at
    while True:
        if read_by.get(name, set()) != {reader}:
            return None  # read elsewhere too
        source = producers.get(name)
        found = body[source] if source is not None else None
        if not isinstance(found, KernelCall):
            return None
        if found.jit:
            gemv = called(found, specs)
            plan = gemv.plan if gemv is not None else None
            if not isinstance(plan, GemvPlan) or plan.gated or plan.epilogue is not None or len(plan.products) != 1:
                return None
            last = found.outputs[-1]
            return (source, views) if last is not None and last.name == name else None  # type: ignore[return-value]
        if found.target not in RESHAPES or writes_memory(found) or not found.args or not isinstance(found.args[0], Ref):
            return None
        views.insert(0, source)  # type: ignore[arg-type]
        reader, name = source, found.args[0].name  # type: ignore[assignment]


def _fits(group: FusedGroup, given: int, gemv: FusedKernel, spec: FusedKernel, gemv_at: int, at: int,
          views: list[int], body: tuple[Line, ...], specs: Mapping[str, FusedKernel],
          producers: dict[str, int]) -> bool:  # fmt: skip
    """Whether the group reads the product at its own elements, its other inputs exist where the product
    kernel runs, and nothing between the two writes memory."""
    plan: GemvPlan = gemv.plan  # type: ignore[assignment]
    meta = group.inputs[given].meta
    if meta is None or not meta.is_contiguous() or tuple(meta.shape) != tuple(group.shape):
        return False
    if meta.numel != plan.m * plan.products[0].n:
        return False
    others = [name for i, name in enumerate(spec.inputs) if i != given]
    if any(producers.get(name, -1) > gemv_at for name in others):
        return False  # made after the product kernel
    return not any(writes_in_place(body[i], specs) for i in range(gemv_at + 1, at) if i not in views)


def merged(gemv: FusedKernel, group: FusedKernel, given: int, views: list[Line]) -> FusedKernel:
    """The product kernel ending with the group: its input(s), the group's other inputs, its weights and
    bias; its prologue's stored outputs, then the group's output in place of the product. Its ATen side:
    the product kernel's calls, the views, the group's calls."""
    plan: GemvPlan = replace(gemv.plan, epilogue=group.plan, epilogue_y=given)  # type: ignore[type-var]
    weights = len(plan.products) + sum(p.bias for p in plan.products)  # the weights and biases, last
    lead = len(gemv.inputs) - weights
    own = list(zip(gemv.inputs, gemv.input_dtypes, strict=True))
    others = [(n, d) for i, (n, d) in enumerate(zip(group.inputs, group.input_dtypes, strict=True)) if i != given]
    return FusedKernel.make(
        gemv.local,
        plan,
        inputs=[*own[:lead], *others, *own[lead:]],
        outputs=[*gemv.outputs[:-1], *group.outputs],
        nodes=(*gemv.nodes, *(v.node for v in views), *group.nodes),  # type: ignore[union-attr]
        describe=f"{gemv.describe}, ending with its {group.describe}",
        lines=[*gemv.lines, *views, *group.lines],  # type: ignore[list-item]
    )
