"""Norms as the prologue of the products that read them: a row kernel of one row whose output only a
matrix-vector kernel reads becomes that kernel's first step.

A decoder layer normalizes its residual stream (RMSNorm or LayerNorm, the residual add before it) and
multiplies the result by the query/key/value weights, and again by the gate/up weights: at batch 1 the
`fusion` pass makes the add and the norm one row kernel of one row, and the `gemv` pass the products
one kernel, two launches that follow each other twice a layer. Here the matrix-vector kernel takes
the row kernel in: each of its programs computes the row itself (the group's inputs are a few KB, read
from cache) once it has read its weights, and the first program stores the group's other outputs
(the residual sum). The norm's launch, and the trip of its output through memory, are gone.

It applies where the row group (any, not only norms: `FusedGroup` of kind "row" with one row of K
elements, K at most `MAX_K`) has an output that only views read, ending at the input of a one-row
matrix-vector kernel without a prologue, reading it contiguously; and where the lines between the two
write no memory and read none of the group's outputs (the merged kernel runs where the products did).
That output may also be read after the products (a post-norm layer, OLMo-2's, feeds its residual stream
`h = x + norm(o)` to the MLP's products and to the next residual add): the kernel then stores it too.
The merged kernel is one multi-kernel choice against all the ATen calls the two replaced.

Each program reads the group's inputs again, so the merge pays where those reads are few next to the
weights: at most `MAX_REREAD` of the weights' bytes over the whole grid (at the largest tile the kernel
may take). A row that is not a power of two pads the tile, which then holds fewer rows, and a
post-norm layer's group reads four rows (two norms): Gemma-2's (K = 2304, tiles of 4096) read as many
bytes again as their weights, and their products took 3-5x the time of their weights' reads on an H200
(the gate/up kernel 59 us a layer for 85 MB, 20 us of reads). There the norm stays a kernel of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from opgen.runtime.ir import ITEMSIZE, FusedGroup, FusedKernel, GemvPlan, KernelCall, Line, Program, Ref, uses
from opgen.runtime.passes.analysis import RESHAPES, defined_at, readers, writes_memory
from opgen.runtime.passes.fusion.calls import Merge, called, merging
from opgen.runtime.registry import KernelRegistry

MAX_K = 4096  # the row and a tile of weights over it live in registers
MAX_REREAD = 0.5  # the group's inputs read by every program, over the weights' bytes, at most


def fuse_gemv_prologue(program: Program, registry: KernelRegistry) -> Program:
    body = program.body
    producers, read_by = defined_at(body), readers(body)

    def find(at: int, spec: FusedKernel, specs: Mapping[str, FusedKernel]) -> Merge | None:
        line, gemv = body[at], _gemv(body[at], specs)
        if gemv is None or (match := _row_group(line, at, body, specs, producers, read_by)) is None:  # type: ignore[arg-type]
            return None
        group_at, views, returned, stored = match
        group = specs[body[group_at].kernel]  # type: ignore[union-attr]
        if rereads(group.plan, gemv) > MAX_REREAD:  # type: ignore[arg-type]
            return None
        kernel = merged(group, gemv, returned, [body[i] for i in views], stored)
        return kernel, (group_at, *views, at), at, (group.local, gemv.local)

    return merging(program, find)


def _gemv(line: Line, specs: Mapping[str, FusedKernel]) -> FusedKernel | None:
    """The one-row matrix-vector kernel `line` calls, without a prologue, its row contiguous, or None."""
    spec = called(line, specs)
    plan = spec.plan if spec is not None else None
    if not isinstance(plan, GemvPlan) or plan.m != 1 or plan.prologue is not None or plan.x_stride != 1:
        return None
    return spec if plan.k <= MAX_K else None


Match = tuple[int, list[int], int, bool]  # the row kernel's call, the views after it, the output the products
# read, whether that output is also stored (lines after the products read it)


def _row_group(line: KernelCall, at: int, body: tuple[Line, ...], specs: Mapping[str, FusedKernel],
               producers: dict[str, int], read_by: dict[str, set[int]]) -> Match | None:  # fmt: skip
    """(body index of the row kernel's call, of the views between, index of the output the products
    read, whether it is stored too) where the products' input comes from a one-row group as the module
    says, or None."""
    value, views = line.args[0].name, []  # type: ignore[union-attr]
    while True:
        reader, found_by = at if not views else views[0], read_by.get(value, set())
        if reader not in found_by:
            return None
        others = found_by - {reader}
        source = producers.get(value)
        if source is None:
            return None
        found = body[source]
        if not isinstance(found, KernelCall):
            return None
        if found.jit:
            break
        if others:
            return None  # a view something else reads
        if found.target not in RESHAPES or writes_memory(found) or not found.args or not isinstance(found.args[0], Ref):
            return None
        views.insert(0, source)
        value = found.args[0].name
    if any(i < at for i in others):
        return None  # read before the products run
    spec = specs.get(found.kernel)
    group = spec.plan if spec is not None else None
    if not isinstance(group, FusedGroup) or group.kind != "row" or spec is None:
        return None
    rows, k = group.shape[:-1], group.shape[-1]
    if any(n != 1 for n in rows) or k != specs[line.kernel].plan.k:  # type: ignore[union-attr]
        return None
    names = [v.name for v in found.outputs if v is not None]
    returned = names.index(value)
    stored = set(names) - ({value} if not others else set())
    for between in range(source + 1, at):
        if between in views:
            continue
        if writes_memory(body[between]) or stored & set(uses(body[between])):
            return None
    meta = found.outputs[returned].meta
    if meta is None or not meta.is_contiguous():
        return None
    return source, views, returned, bool(others)


def rereads(group: FusedGroup, gemv: FusedKernel) -> float:
    """The bytes of the group's inputs that the merged kernel's programs read (each reads them all), over
    the bytes of its weights, at the largest tile it may take (the fewest programs)."""
    plan: GemvPlan = gemv.plan  # type: ignore[assignment]
    programs = plan.blocks(max(plan.whole_row_tiles()))
    row_bytes = sum(
        (t.meta.numel if t.meta.is_static else plan.k) * ITEMSIZE.get(t.meta.dtype, 4) for t in group.inputs
    )
    weights = sum(p.n for p in plan.products) * plan.k * ITEMSIZE.get(gemv.input_dtypes[0], 4)  # x's dtype is theirs
    return programs * row_bytes / max(weights, 1)


def merged(
    group: FusedKernel, gemv: FusedKernel, returned: int, views: list[Line], stored: bool = False
) -> FusedKernel:
    """The matrix-vector kernel computing its input first: the group's inputs, then the products' weights
    and biases; the group's other outputs (with `stored`, all of them), then the products' outputs. Its
    ATen side: the group's calls, the views, the products' calls."""
    plan = replace(gemv.plan, prologue=group.plan, prologue_x=returned, prologue_stored=stored)  # type: ignore[type-var]
    inputs = [*zip(group.inputs, group.input_dtypes, strict=True)]
    inputs += zip(gemv.inputs[1:], gemv.input_dtypes[1:], strict=True)  # the weights and biases
    outputs = [v for i, v in enumerate(group.outputs) if i != returned or stored]
    lines = [*group.lines, *views, *gemv.lines]
    return FusedKernel.make(
        gemv.local,
        plan,
        inputs=inputs,
        outputs=[*outputs, *gemv.outputs],
        nodes=(*group.nodes, *(v.node for v in views), *gemv.nodes),  # type: ignore[union-attr]
        describe=f"{gemv.describe}, its row computed first ({group.describe})",
        lines=lines,  # type: ignore[arg-type]
    )
