"""Norms as the last step of the products before them, computed by the product kernel's last program: a
row kernel of one row that reads a one-row matrix-vector kernel's product becomes that kernel's end.

`gemv_prologue` makes a norm the first step of the products after it, each of their programs computing
the row again. Where those reads would cost too much it leaves the norm a row kernel of one program
between two product kernels: Gemma-2's post-norm layers (two norms and the residual add in one group,
rows of 2304 padded to tiles of 4096) and Phi-3's rows of 3072. Here the product kernel before the norm
(the attention's output projection, the MLP's down projection) takes it in: each program stores its block
of the product and takes a ticket from a counter; the last to arrive computes the group's row whole,
reading the product back from L2, and stores the group's outputs. The row is computed once, as before;
the row kernel's launch and its wait for the products are gone.

It applies where a row group of one row (`FusedGroup` of kind "row", one row) reads the product of a
one-row matrix-vector kernel of one product (not a gated pair's, without a prologue; a pointwise epilogue
allowed) through views that nothing else reads, at the group's own elements (contiguous, the group's
shape); where the group's other inputs exist before the product kernel runs, and the lines between write
no memory (the merged kernel runs where the product kernel did). It runs after `gemv_prologue`, which
keeps the norms it takes: there no program waits for the others. The merged kernel is one multi-kernel
choice against all the ATen calls the two replaced; its counter (one int32, zeroed in setup, set back to
zero by the last program) is among its written inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from opgen.runtime.ir import FusedGroup, FusedKernel, GemvPlan, KernelCall, Line, Program, Value
from opgen.runtime.passes.analysis import defined_at, fresh_namer, readers
from opgen.runtime.passes.fusion.calls import Merge, merging
from opgen.runtime.passes.fusion.gemv_epilogue import fits_after_product, product_source
from opgen.runtime.passes.fusion.split_buffers import counter_buffer
from opgen.runtime.registry import KernelRegistry


def fuse_gemv_row_epilogue(program: Program, registry: KernelRegistry) -> Program:
    if not any(isinstance(spec.plan, GemvPlan) and _takes(spec.plan) for spec in program.fused):
        return program
    body = program.body
    producers, read_by = defined_at(body), readers(body)
    names, counters = fresh_namer(program, "gemv_count"), []

    def find(at: int, spec: FusedKernel, specs: Mapping[str, FusedKernel]) -> Merge | None:
        if (taken := _taker(spec, at, body, specs, producers, read_by)) is None:
            return None
        given, gemv_at, views = taken
        gemv = specs[body[gemv_at].kernel]  # type: ignore[union-attr]
        counter = counter_buffer(next(names), 1, gemv.device, body[gemv_at].node)
        counters.append(counter)
        kernel = merged(gemv, spec, given, [body[i] for i in views], counter.outputs[0])  # type: ignore[arg-type]
        return kernel, (gemv_at, *views, at), gemv_at, (gemv.local, spec.local)

    merged_program = merging(program, find)
    read = {name for spec in merged_program.fused for name in spec.inputs}
    made = [c for c in counters if c.outputs[0].name in read]  # type: ignore[union-attr]  # the merges taken
    return replace(merged_program, setup=(*merged_program.setup, *made))


def _takes(plan: GemvPlan) -> bool:
    """A product kernel whose last program can compute a row: one row, one product, no prologue."""
    one = plan.m == 1 and not plan.gated and len(plan.products) == 1
    return one and plan.prologue is None and plan.row_epilogue is None


def _taker(spec: FusedKernel, at: int, body: tuple[Line, ...], specs: Mapping[str, FusedKernel],
           producers: dict[str, int], read_by: dict[str, set[int]]) -> tuple[int, int, list[int]] | None:  # fmt: skip
    """(the group's input that is the product, body index of the product kernel's call, of the views between)
    where the row kernel `spec`, called at `at`, can be that product kernel's end, as the module says;
    else None. The first input that is such a kernel's product decides."""
    group = spec.plan
    if not isinstance(group, FusedGroup) or group.kind != "row" or any(n != 1 for n in group.shape[:-1]):
        return None
    for given, name in enumerate(spec.inputs):
        match = product_source(name, at, body, specs, producers, read_by, accepts=_takes)
        if match is not None:
            gemv_at, views = match
            gemv = specs[body[gemv_at].kernel]  # type: ignore[union-attr]
            fits = fits_after_product(group, given, gemv, spec, gemv_at, at, views, body, specs, producers)
            return (given, gemv_at, views) if fits else None
    return None


def merged(gemv: FusedKernel, group: FusedKernel, given: int, views: list[Line], counter: Value) -> FusedKernel:
    """The product kernel ending with the group: its inputs, the group's other inputs, the counter; its
    product, then the group's outputs. Its ATen side: the product kernel's calls, the views, the group's."""
    plan = replace(gemv.plan, row_epilogue=group.plan, row_epilogue_y=given)  # type: ignore[type-var]
    others = [(n, d) for i, (n, d) in enumerate(zip(group.inputs, group.input_dtypes, strict=True)) if i != given]
    lines: list[KernelCall] = [*gemv.lines, *views, *group.lines]  # type: ignore[list-item]
    return FusedKernel.make(
        gemv.local,
        plan,
        inputs=[*zip(gemv.inputs, gemv.input_dtypes, strict=True), *others, (counter.name, "int32")],
        outputs=[*gemv.outputs, *group.outputs],
        nodes=(*gemv.nodes, *(v.node for v in views), *group.nodes),  # type: ignore[union-attr]
        describe=f"{gemv.describe}, its last program computing the {group.describe}",
        lines=lines,
        writes=(counter,),
    )
