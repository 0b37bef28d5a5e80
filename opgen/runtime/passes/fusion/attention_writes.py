"""A step's cache writes taken into the attention that reads the cache: the decode-attention kernel stores
the step's key and value rows itself, then reads them with the rest of the cache.

A decode layer stores its new key and value rows into the KV cache (`cache_writes`: one kernel), and the
attention reads the cache right after (`decode_attention`: one kernel). Two launches follow each other,
the first a few microseconds of fixed cost for two rows. Here the attention kernel takes the writes in:
each of its programs stores its key/value head's rows at the step's position, then reads the cache
(`codegen.triton.attention_writes`). A layer launches one kernel fewer.

It applies to a cache-write kernel of two writes through one position (no update of a buffer by a
number), the position a sum of one-element terms (a cache's counter and the step's offset), into
exactly the key and value buffers of a decode-attention kernel after it: [B, H, S, D] buffers written
along S with rows of [B, H, 1, D]. The lines between must write no memory but their fresh outputs, and
touch neither buffer (nor anything sharing their storage). The merged kernel takes the attention's
place, so the rows' values and the position's terms, computed before the writes, are ready there. It is
one multi-kernel choice against the ATen calls of both, the writes first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from opgen.runtime.ir import (
    AttentionPlan,
    CacheWritePlan,
    FusedKernel,
    Line,
    Program,
    StepRows,
    program_lines,
    uses,
)
from opgen.runtime.passes.analysis import Groups, alias_groups
from opgen.runtime.passes.fusion.calls import Merge, called, merging, writes_in_place
from opgen.runtime.registry import KernelRegistry


def fuse_attention_writes(program: Program, registry: KernelRegistry) -> Program:
    body, storage = program.body, alias_groups(program_lines(program), registry)

    def find(at: int, writer: FusedKernel, specs: Mapping[str, FusedKernel]) -> Merge | None:
        if _rows(writer) is None or (match := _attention_after(at, writer, body, specs, storage)) is None:
            return None
        reader_at, attention = match
        kernel = merged(writer, attention)
        return None if kernel is None else (kernel, (at, reader_at), reader_at, (writer.local, attention.local))

    return merging(program, find)


def _rows(writer: FusedKernel) -> CacheWritePlan | None:
    """The writer's plan where it is two writes of rows at one position, a sum of one-element terms."""
    plan = writer.plan
    if not isinstance(plan, CacheWritePlan) or plan.positions is None or plan.length != 1 or len(plan.writes) != 2:
        return None
    for write in plan.writes:
        shape = write.dst.shape
        if write.plus is not None or write.dim != 2 or len(shape) != 4 or write.region != (*shape[:2], 1, shape[3]):
            return None
    return plan


def _attention_after(at: int, writer: FusedKernel, body: Sequence[Line], specs: Mapping[str, FusedKernel],
                     storage: Groups) -> tuple[int, FusedKernel] | None:  # fmt: skip
    """(body index, kernel) of the decode attention after `at` that reads the buffers the writer writes,
    where the lines between touch neither buffer and write no memory; else None."""
    written = {v.name for v in writer.writes}
    cache = {storage.find(name) for name in written}
    for index in range(at + 1, len(body)):
        line = body[index]
        reader = called(line, specs)
        if reader is not None and isinstance(reader.plan, AttentionPlan) and reader.plan.step_rows is None:
            if set(reader.inputs[1:3]) == written:
                return index, reader
        if writes_in_place(line, specs) or {storage.find(name) for name in uses(line)} & cache:
            return None
    return None


def merged(writer: FusedKernel, attention: FusedKernel) -> FusedKernel | None:
    """The attention kernel storing the writer's rows first: its inputs the attention's (query, key,
    value, mask), then the key rows, the value rows and the position's terms, then its scratch buffers;
    it writes the key and value buffers too. None where the writes are not the cache's rows as the
    attention reads it (another layout, another dtype)."""
    plan: AttentionPlan = attention.plan  # type: ignore[assignment]
    cache_plan: CacheWritePlan = writer.plan  # type: ignore[assignment]
    terms = len(cache_plan.positions or ())
    # The writer's inputs: the terms, then (buffer, rows) per write.
    pairs = {writer.inputs[terms + 2 * i]: (writer.inputs[terms + 2 * i + 1], i) for i in range(2)}
    key, value = attention.inputs[1], attention.inputs[2]
    (key_rows, k), (value_rows, v) = pairs[key], pairs[value]
    dtype = dict(zip((*writer.inputs, *attention.inputs), (*writer.input_dtypes, *attention.input_dtypes), strict=True))
    strides = []
    for (rows, i), meta in (((key_rows, k), plan.key), ((value_rows, v), plan.value)):
        write = cache_plan.writes[i]
        if write.dst != meta or dtype[rows] != meta.dtype:
            return None
        sb, sh, _, sd = write.values_stride
        strides.append((sb, sh, sd))
    own = plan.own_inputs
    inputs = [*attention.inputs[:own], key_rows, value_rows, *writer.inputs[:terms], *attention.inputs[own:]]
    return FusedKernel.make(
        attention.local,
        replace(plan, step_rows=StepRows(strides[0], strides[1], terms)),  # type: ignore[arg-type]
        inputs=((name, dtype[name]) for name in inputs),
        outputs=attention.outputs,
        nodes=(*writer.nodes, *attention.nodes),
        describe=f"{attention.describe}, storing the step's keys and values first",
        lines=(*writer.lines, *attention.lines),
        writes=(*writer.writes, *attention.writes),
    )
