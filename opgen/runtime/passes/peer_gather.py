"""Small CUDA all-gathers through opgen's own one-shot kernel over peer memory.

A tensor-parallel decoder ends each step gathering its ranks' logits (`all_gather_into_tensor` of the
vocabulary's shard: 128 KB a rank for Llama 3 at TP=2). NCCL's general path pays its latency for that,
as for decode's small all-reduces. opgen's kernel (`execution.peer_gather_kernel`) sends each rank's
part straight into every peer's mapped buffer in 8-byte words carrying the call's epoch (32 bits of
values each), and every rank copies the parts out as they land, as `peer_sum` does for an all-reduce.
Measured on 2 H200s (`docs/distributed.md`), replayed in a CUDA graph: 4.24 us a call for the
logits of Llama 3 at TP=2 (64128 bfloat16 a rank) against NCCL's 11.46, and 6.34 against 14.80 at 1 MiB
gathered.

An `all_gather` issue line (after `passes.collectives`) is chosen where its tensor is on CUDA, static,
contiguous, float32, bfloat16 or float16, the group has 2, 4, 6 or 8 ranks (as `one_shot_all_reduce`
takes) and the gathered output holds at most `PEER_GATHER_MAX_BYTES`. The line then calls a record of
kind "peer_gather" (one per group and dtype, sized for its largest input: `passes.stream_ordered`) that
gathers on the current stream: no Work, so the line loses its Work value and the wait line goes. The
report notes each record, and why each other all-gather stays on the process group. Leaving this pass
out of `passes=` keeps every all-gather on the process group (NCCL); where opgen's JIT cannot run when
the graph is bound, the record runs on the process group too (`execution.peer_gather`), with a warning.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import ITEMSIZE, Collective, KernelCall, Program, Ref, TensorMeta, meta_table
from opgen.runtime.passes.one_shot_all_reduce import WORLD_SIZES
from opgen.runtime.passes.stream_ordered import Chosen, stream_ordered, tensor_bytes
from opgen.runtime.registry import KernelRegistry

PEER_GATHER_MAX_BYTES = 1024 * 1024  # the gathered output; the largest measured (0.43x NCCL's time)
DTYPES = ("float32", "bfloat16", "float16")  # 32 bits of values a word: one float32, two of the others


def peer_gathers(program: Program, registry: KernelRegistry) -> Program:
    records = {c.local: c for c in program.collectives}
    gathers = {local for local, c in records.items() if c.kind == "all_gather"}
    if not gathers:
        return program
    metas = meta_table(program)
    chosen: Chosen = {}  # work value -> (its all-gather's record, the tensor it sends)
    notes = []
    for line in program.body:
        if not (isinstance(line, KernelCall) and line.jit and line.kernel in gathers):
            continue
        record = records[line.kernel]
        out, tensor = (metas.get(a.name) if isinstance(a, Ref) else None for a in line.args) if len(line.args) == 2 \
            else (None, None)  # fmt: skip
        why = _refusal(record, out, tensor)
        if why is not None:
            notes.append(f"all-gather of node '{line.node}' ({_size(out)}, group '{record.group}'): "
                         f"the process group (NCCL on CUDA): {why}")  # fmt: skip
        elif tensor is not None and line.outputs and line.outputs[0] is not None:
            chosen[line.outputs[0].name] = (record, tensor)
    if not chosen:
        return replace(program, notes=(*program.notes, *notes))
    body, collectives = stream_ordered(program, chosen, "peer_gather")
    for made in (c for c in collectives if c.kind == "peer_gather" and c.local not in records):
        gathered = made.numel * ITEMSIZE[made.dtype] * (made.group_size or 1)
        notes.append(f"one-shot all-gathers of group '{made.group}' ({made.dtype}, up to {gathered} bytes "
                     "gathered): opgen's kernel (`peer_gather`)")  # fmt: skip
    return replace(program, body=body, collectives=collectives, notes=(*program.notes, *notes))


def _refusal(record: Collective, out: TensorMeta | None, tensor: TensorMeta | None) -> str | None:
    """Why an all-gather stays on the process group, or None where opgen's kernel takes it."""
    if out is None or tensor is None or not tensor.device.startswith("cuda"):
        return "not a CUDA tensor"
    if record.group_size not in WORLD_SIZES:
        return f"a group of {record.group_size} ranks (`peer_gather` takes {', '.join(map(str, WORLD_SIZES))})"
    if tensor.dtype not in DTYPES or out.dtype != tensor.dtype:
        return f"dtype {tensor.dtype} (`peer_gather` takes {', '.join(DTYPES)})"
    if not (tensor.is_static and out.is_static):
        return "a symbolic size"
    if not (tensor.is_contiguous() and out.is_contiguous()) or tensor.offset != 0 or out.offset != 0:
        return "not contiguous"
    if out.numel != tensor.numel * record.group_size:
        return f"an output of {out.numel} elements for {record.group_size} x {tensor.numel}"
    if tensor_bytes(out) > PEER_GATHER_MAX_BYTES:
        return f"over {PEER_GATHER_MAX_BYTES // 1024} KiB gathered (`peer_gather`'s limit)"
    return None


def _size(out: TensorMeta | None) -> str:
    if out is None or not out.is_static or out.dtype not in ITEMSIZE:
        return "an output of unknown size"
    return f"{tensor_bytes(out)} bytes gathered"
