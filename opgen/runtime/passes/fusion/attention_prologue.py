"""The pointwise kernel before a decode attention taken into it: the attention computes its query (and the
key rows it stores, `attention_writes`) where it would load them.

A decoder layer rotates its query and its new key (rotary embedding) right before the attention: one
pointwise kernel (or, after `horizontal`, one launch for both rotations) whose outputs only the attention
reads. Here the attention kernel runs that code itself (`codegen.triton.attention_prologue`): each
program computes its query rows, and its head's key row where it stores the step's rows. The pointwise
launch, and its outputs' trip through memory, are gone.

It applies to a generated kernel of pointwise groups (one group, or a `horizontal` launch of several)
every output of which is the attention's query or its stored key rows, read by nothing else, each
group's iteration space that value's shape; where the lines between the two write no memory but their
fresh outputs (the groups' inputs hold the same values at the attention's place, where the merged kernel
runs). An output stored through a chain of data movements (`placement`) stays apart. The merged kernel is
one multi-kernel choice against the ATen calls of both, the pointwise ones first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from opgen.runtime.ir import (
    AttentionPlan,
    Computed,
    FusedKernel,
    Line,
    Program,
)
from opgen.runtime.passes.analysis import defined_at, readers
from opgen.runtime.passes.fusion.calls import Merge, called, launched_groups, merging, writes_in_place
from opgen.runtime.registry import KernelRegistry


def fuse_attention_prologue(program: Program, registry: KernelRegistry) -> Program:
    body = program.body
    producers, read_by = defined_at(body), readers(body)

    def find(at: int, attention: FusedKernel, specs: Mapping[str, FusedKernel]) -> Merge | None:
        if not isinstance(attention.plan, AttentionPlan) or attention.plan.query_part is not None:
            return None
        if (match := _producer(at, attention, body, specs, producers, read_by)) is None:
            return None
        source_at, source = match
        kernel = merged(source, attention)
        return None if kernel is None else (kernel, (source_at, at), at, (source.local, attention.local))

    return merging(program, find)


def _computed(attention: FusedKernel) -> dict[str, tuple[int, ...]]:
    """The values the attention could compute: its query, and its stored key rows -> their shape."""
    plan: AttentionPlan = attention.plan  # type: ignore[assignment]
    values = {attention.inputs[0]: tuple(plan.query.shape)}
    if plan.step_rows is not None:
        keys = attention.inputs[plan.own_inputs]  # the key rows, just after (`attention_writes`)
        batch, heads, _, dim = plan.key.shape
        values[keys] = (batch, heads, 1, dim)
    return values  # type: ignore[return-value]


def _producer(at: int, attention: FusedKernel, body: Sequence[Line], specs: Mapping[str, FusedKernel],
              producers: dict[str, int], read_by: dict[str, set[int]]) -> tuple[int, FusedKernel] | None:  # fmt: skip
    """(body index, kernel) of the pointwise kernel whose outputs are all values the attention could
    compute and reads alone, as the module says; else None."""
    computed = _computed(attention)
    source_at = producers.get(attention.inputs[0])
    source = called(body[source_at], specs) if source_at is not None else None
    groups = launched_groups(source) if source is not None else ()
    if source is None or not groups:
        return None
    for group in groups:
        if group.kind != "pointwise" or len(group.outputs) != 1:
            return None
        out = group.outputs[0]
        if out.placement is not None or computed.get(out.name) != tuple(group.shape):
            return None
        if read_by.get(out.name) != {at}:
            return None
    if any(writes_in_place(line, specs) for line in body[source_at + 1 : at]):  # type: ignore[operator]
        return None
    return source_at, source  # type: ignore[return-value]


def merged(source: FusedKernel, attention: FusedKernel) -> FusedKernel | None:
    """The attention computing what `source` computed: the groups' inputs first (each graph value once),
    then the attention's inputs but the values it now computes. None where a group reads one of the
    attention's other inputs (the kernel takes each graph value once)."""
    plan: AttentionPlan = attention.plan  # type: ignore[assignment]
    computed = _computed(attention)
    shared = list(dict.fromkeys(t.name for g in launched_groups(source) for t in g.inputs))
    parts = {}
    for group in launched_groups(source):
        parts[group.outputs[0].name] = Computed(group, tuple(shared.index(t.name) for t in group.inputs))
    rest = [name for name in attention.inputs if name not in parts]  # the parameters' order: codegen's
    if set(shared) & set(rest):
        return None
    query, keys = attention.inputs[0], [name for name in computed if name != attention.inputs[0]]
    step_rows = plan.step_rows
    if keys and keys[0] in parts:
        step_rows = replace(step_rows, key_part=parts[keys[0]])  # type: ignore[arg-type]
    if query not in parts:
        return None  # the query stays loaded: nothing to merge for it (a key rows' kernel alone is rare)
    dtype = dict(zip((*source.inputs, *attention.inputs), (*source.input_dtypes, *attention.input_dtypes), strict=True))
    return FusedKernel.make(
        attention.local,
        replace(plan, query_part=parts[query], step_rows=step_rows, shared_inputs=len(shared)),
        inputs=((name, dtype[name]) for name in (*shared, *rest)),
        outputs=attention.outputs,
        nodes=(*source.nodes, *attention.nodes),
        describe=f"{attention.describe}, its query{' and keys' if keys and keys[0] in parts else ''} computed first",
        lines=(*source.lines, *attention.lines),
        writes=attention.writes,
    )
