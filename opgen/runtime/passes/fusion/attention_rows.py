"""The row kernel before a decode attention's computed query taken in too: the attention computes the norm
its rotation reads (OLMo-2's q/k norms) where the rotation reads it.

After `attention_prologue` the attention computes its query and its stored key rows from the rotation's
inputs. In OLMo-2 (and any model that normalizes q and k over their whole width before rotating them) those
inputs are views of a norm's outputs: row kernels, one launch for both after `horizontal`, between the
q/k/v product and the attention. Here the attention computes them too (`codegen.triton.group_parts`:
`row_stats`, `row_value`): each call of the query's (or key's) function first reduces its batch row's whole
row once (a norm's mean of squares), then computes the norm's value at each element the rotation reads.
The row kernel's launch, and its outputs' trip through memory, are gone.

It applies where every input of the attention's computed values that is not a plain load is a view (a chain
of views, read by nothing else) of an output of one row-kernel launch that the attention alone reads, and:
- each of its groups' row steps is a sum, mean, max or min over the row (not a softmax or a fused layer
  norm, whose results are per element), its rows are the attention's batch rows, at most `MAX_ROW` long,
  and its outputs are stored whole, row-major, where nothing moves them (no placement);
- each view keeps a batch row's elements within that row of the norm (its batch stride the row's length),
  so that a call of the value's function, which covers one batch row, reads one row of the norm;
- the lines between the two write no memory (the row kernel's inputs hold their values at the attention's
  place).
The merged kernel is one multi-kernel choice against the ATen calls of both (the row kernel's, the views',
then the attention's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from opgen.runtime.ir import (
    AttentionPlan,
    Computed,
    FusedGroup,
    FusedKernel,
    KernelCall,
    Line,
    Program,
    Ref,
    RowRead,
    RowSource,
    Tensor,
    contiguous_strides,
)
from opgen.runtime.ir.fusible import REDUCTIONS, ROW_OPS
from opgen.runtime.passes.analysis import defined_at, is_view_call, readers
from opgen.runtime.passes.fusion.calls import Merge, called, launched_groups, merging, writes_in_place
from opgen.runtime.registry import KernelRegistry

MAX_ROW = 4096  # a row reduced whole in registers by every program of the attention, for each row group


def fuse_attention_rows(program: Program, registry: KernelRegistry) -> Program:
    body = program.body
    producers, read_by = defined_at(body), readers(body)

    def source_of(name: str) -> tuple[list[int], int | None, str]:
        """(body indices of the chain of views `name` is, the index of the line under them, its value)."""
        chain: list[int] = []
        while (at := producers.get(name)) is not None and is_view_call(body[at], registry):
            sources = [a.name for a in body[at].args if isinstance(a, Ref)]  # type: ignore[union-attr]
            if len(sources) != 1:
                return chain, None, name
            chain.append(at)
            name = sources[0]
        return chain, producers.get(name), name

    def find(at: int, attention: FusedKernel, specs: Mapping[str, FusedKernel]) -> Merge | None:
        plan = attention.plan
        if not isinstance(plan, AttentionPlan) or plan.query_part is None or plan.query_part.rows:
            return None
        parts = _parts(plan)
        traced = {t.name: source_of(t.name) for part in parts for t in part.group.inputs}
        kernels = {k for _, k, _ in traced.values() if k is not None and _row_groups(called(body[k], specs))}
        if len(kernels) != 1:
            return None
        (source_at,) = kernels
        source: FusedKernel = called(body[source_at], specs)  # type: ignore[assignment]
        groups = _row_groups(source)
        outputs = {out.name: (k, o) for k, g in enumerate(groups) for o, out in enumerate(g.outputs)}
        reads = {name: outputs[base] for name, (_, k, base) in traced.items() if k == source_at and base in outputs}
        chain = sorted({i for name in reads for i in traced[name][0]})
        batch = int(plan.query.shape[0])  # type: ignore[arg-type]
        if not all(_fits(g, batch) for g in groups) or not reads:
            return None
        if not _alone(source, chain, at, read_by, body, attention.inputs[plan.shared_inputs :]):
            return None
        for part in parts:
            for t in part.group.inputs:
                if t.name in reads and not _within_row(t, groups[reads[t.name][0]], part.group):
                    return None
        if any(writes_in_place(line, specs) for i, line in enumerate(body[source_at + 1 : at], source_at + 1)
               if i not in chain):  # fmt: skip
            return None
        kernel = _merged(source, attention, reads, [body[i] for i in chain])  # type: ignore[misc]
        if kernel is None:
            return None
        return kernel, (source_at, *chain, at), at, (source.local, attention.local)

    return merging(program, find)


def _parts(plan: AttentionPlan) -> list[Computed]:
    key = plan.step_rows.key_part if plan.step_rows is not None else None
    return [p for p in (plan.query_part, key) if p is not None]


def _row_groups(spec: FusedKernel | None) -> tuple[FusedGroup, ...]:
    """The row groups `spec` launches (one, or `horizontal`'s several); () for any other kernel."""
    groups = launched_groups(spec) if spec is not None else ()
    return groups if groups and all(g.kind == "row" for g in groups) else ()


def _fits(group: FusedGroup, batch: int) -> bool:
    """Reductions over the row alone, the attention's batch rows, and outputs stored whole and row-major."""
    steps = [s for s in group.steps if s.target in ROW_OPS]
    if not steps or any(s.target not in REDUCTIONS for s in steps) or any(s.branches for s in group.steps):
        return False
    if math.prod(group.shape[:-1]) != batch or group.shape[-1] > MAX_ROW:
        return False
    return all(
        out.placement is None and tuple(out.meta.shape) == tuple(group.shape) and out.meta.offset == 0
        and tuple(out.meta.stride) == contiguous_strides(group.shape)
        for out in group.outputs
    )  # fmt: skip


def _alone(source: FusedKernel, chain: Sequence[int], at: int, read_by: dict[str, set[int]], body: Sequence[Line],
           rest: Sequence[str]) -> bool:  # fmt: skip
    """The row kernel's outputs, and the views of them, read by those views and the attention alone, and by the
    attention only as inputs of the values it computes (not among its `rest`, its own inputs)."""
    allowed = {*chain, at}
    names = [v.name for v in source.outputs] + [v.name for i in chain for v in body[i].outputs]  # type: ignore[union-attr]
    return all(read_by.get(name, set()) <= allowed for name in names) and not set(names) & set(rest)


def _within_row(view: Tensor, group: FusedGroup, space: FusedGroup) -> bool:
    """Every element of batch row b of the computed value's group (`space`, [B, ...]) reads row b of the norm:
    the view's batch stride is the row's length, and its other dimensions stay within one row."""
    meta, n = view.meta, group.shape[-1]
    if len(meta.shape) != len(space.shape) or any(s < 0 for s in meta.stride):
        return False
    batch = int(space.shape[0])
    if batch > 1 and (int(meta.shape[0]) != batch or meta.stride[0] != n):
        return False
    reach = sum((int(size) - 1) * stride for size, stride in zip(meta.shape[1:], meta.stride[1:], strict=True))
    return meta.offset + reach < n


def _merged(source: FusedKernel, attention: FusedKernel, reads: Mapping[str, tuple[int, int]],
            views: Sequence[KernelCall]) -> FusedKernel | None:  # fmt: skip
    """The attention computing the row groups' outputs its computed values read: their inputs join its
    shared ones (each graph value once); None where one of them is among its other inputs."""
    plan: AttentionPlan = attention.plan  # type: ignore[assignment]
    groups = _row_groups(source)
    rest = attention.inputs[plan.shared_inputs :]
    parts = _parts(plan)
    plain = [t.name for part in parts for t in part.group.inputs if t.name not in reads]
    shared = list(dict.fromkeys([*plain, *(t.name for g in groups for t in g.inputs)]))
    if set(shared) & set(rest):
        return None

    def computed(part: Computed) -> Computed:
        used = list(dict.fromkeys(reads[t.name][0] for t in part.group.inputs if t.name in reads))
        rows = tuple(RowSource(groups[k], tuple(shared.index(t.name) for t in groups[k].inputs)) for k in used)
        row_reads = tuple(
            RowRead(i, used.index(reads[t.name][0]), reads[t.name][1])
            for i, t in enumerate(part.group.inputs)
            if t.name in reads
        )
        args = tuple(-1 if t.name in reads else shared.index(t.name) for t in part.group.inputs)
        return replace(part, args=args, rows=rows, reads=row_reads)

    step_rows = plan.step_rows
    if step_rows is not None and step_rows.key_part is not None:
        step_rows = replace(step_rows, key_part=computed(step_rows.key_part))
    merged_plan = replace(plan, query_part=computed(plan.query_part), step_rows=step_rows, shared_inputs=len(shared))  # type: ignore[arg-type]
    dtype = dict(zip((*source.inputs, *attention.inputs), (*source.input_dtypes, *attention.input_dtypes), strict=True))
    return FusedKernel.make(
        attention.local,
        merged_plan,
        inputs=((name, dtype[name]) for name in (*shared, *rest)),
        outputs=attention.outputs,
        nodes=(*source.nodes, *(v.node for v in views), *attention.nodes),
        describe=f"{attention.describe}, the rows they read too ({source.describe})",
        lines=(*source.lines, *views, *attention.lines),
        writes=attention.writes,
    )
