"""Chosen collectives made stream-ordered: one record per (group, dtype), no Work, no wait line.

`one_shot_all_reduce` and `peer_gather` pick issue lines (after `passes.collectives`) whose collective
can run as one kernel on the current stream. Each picked line then calls a record of the new kind (one
per group and dtype, sized for its largest tensor) and loses its Work value; its wait line goes, as
nothing is in flight. The records no line calls any more go too.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import ITEMSIZE, Collective, KernelCall, Line, Program, Ref, TensorMeta, defs, program_lines

Chosen = dict[str, tuple[Collective, TensorMeta]]  # work value -> (its issue line's record, the tensor it sends)


def tensor_bytes(meta: TensorMeta) -> int:
    """The bytes of a static tensor of a known dtype: what the passes' size limits count."""
    return meta.numel * ITEMSIZE[meta.dtype]


def stream_ordered(program: Program, chosen: Chosen, kind: str) -> tuple[tuple[Line, ...], tuple[Collective, ...]]:
    """The body and records of `program` with the `chosen` issue lines calling records of `kind`."""
    made = _records(program, chosen, kind)
    body: list[Line] = []
    for line in program.body:
        if isinstance(line, KernelCall) and line.jit and line.outputs and line.outputs[0] is not None:
            work = line.outputs[0].name
            if work in chosen:
                record, meta = chosen[work]
                body.append(replace(line, kernel=made[(record.group, meta.dtype)].local, outputs=()))
                continue
        if isinstance(line, KernelCall) and line.jit and line.args and isinstance(line.args[0], Ref):
            if line.args[0].name in chosen:  # the wait for a chosen collective: nothing is in flight
                continue
        body.append(line)
    called = {line.kernel for line in body if isinstance(line, KernelCall) and line.jit}
    kept = tuple(c for c in program.collectives if c.local in called)
    return tuple(body), (*kept, *made.values())


def _records(program: Program, chosen: Chosen, kind: str) -> dict[tuple[str, str], Collective]:
    """One record of `kind` per (group, dtype), sized for the largest tensor it sends."""
    taken = {c.local for c in program.collectives} | {v.name for line in program_lines(program) for v in defs(line)}
    records: dict[tuple[str, str], Collective] = {}
    for record, meta in chosen.values():
        key = (record.group, meta.dtype)
        if key in records:
            records[key] = replace(records[key], numel=max(records[key].numel, meta.numel))
            continue
        local = f"c10d_{kind}_{len(records)}"
        while local in taken:
            local += "_"
        records[key] = Collective(local, kind, record.group, record.group_size, record.reduce_op,
                                  node=record.node, dtype=meta.dtype, numel=meta.numel)  # fmt: skip
    return records
