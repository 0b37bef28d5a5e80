"""Small all-reduces through a one-shot all-reduce over peer memory, large ones through the process group.

Decoding a tensor-parallel model all-reduces a few KB twice a layer. NCCL's general path took 12-18 us
for such a message (4-8 KB, 2 H200s, replayed in a CUDA graph; docs/distributed.md), while the payload
needs well under one: the cost is latency. A one-shot all-reduce reads every rank's copy straight from
its memory over NVLink and sums locally, one kernel with a barrier before and after (vLLM's and
SGLang's custom all-reduce; here torch's symmetric memory, `symm_mem.one_shot_all_reduce_copy_out`,
which copies the local input into a buffer every rank mapped, then reduces into the output): 6.5-6.7 us
there. It reads world-size times the message per rank, so it loses to NCCL's ring as messages grow:
the choice is by size.

An `all_reduce` issue line (after `passes.collectives`) becomes one-shot where:

- its tensor is on CUDA, static, contiguous, float32 or bfloat16 (the dtypes torch's kernel takes),
  at most `ONE_SHOT_MAX_BYTES`;
- the reduction is a sum and the group has 2, 4, 6 or 8 ranks (the sizes the kernel is built for).

The line then calls a `Collective` of kind "one_shot_all_reduce" (one per group and dtype, sized for
its largest tensor: `passes.stream_ordered`) that reduces in place on the current stream: no Work, so
the issue line loses its Work value and the wait line goes. It uses no NVLink multicast. Every
all-reduce gets a report note saying which path it takes and why. Leaving this pass out of `passes=`
keeps every all-reduce on the process group (NCCL).
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import ITEMSIZE, Collective, KernelCall, Program, Ref, TensorMeta, meta_table
from opgen.runtime.passes.stream_ordered import Chosen, stream_ordered, tensor_bytes
from opgen.runtime.registry import KernelRegistry

ONE_SHOT_MAX_BYTES = 512 * 1024  # vLLM's custom all-reduce stops at 512 KB on 4+ ranks of an H100 node
WORLD_SIZES = (2, 4, 6, 8)  # torch's one-shot kernel: DISPATCH_WORLD_SIZES
DTYPES = ("float32", "bfloat16")  # AT_DISPATCH_FLOAT_AND_BFLOAT16


def one_shot_all_reduces(program: Program, registry: KernelRegistry) -> Program:
    records = {c.local: c for c in program.collectives}
    reductions = {local for local, c in records.items() if c.kind == "all_reduce"}
    if not reductions:
        return program
    metas = meta_table(program)
    chosen: Chosen = {}  # work value -> (its all-reduce's record, tensor)
    notes = []
    for line in program.body:
        if not (isinstance(line, KernelCall) and line.jit and line.kernel in reductions):
            continue
        record = records[line.kernel]
        tensor = line.args[0] if len(line.args) == 1 else None
        meta = metas.get(tensor.name) if isinstance(tensor, Ref) else None
        why = _refusal(record, meta)
        size = _size(meta)
        path = "one-shot over peer memory" if why is None else f"the process group (NCCL on CUDA): {why}"
        notes.append(f"all-reduce of node '{line.node}' ({size}, group '{record.group}'): {path}")
        if why is None and line.outputs and line.outputs[0] is not None:
            assert meta is not None
            chosen[line.outputs[0].name] = (record, meta)
    if not chosen:
        return replace(program, notes=(*program.notes, *notes))
    body, collectives = stream_ordered(program, chosen, "one_shot_all_reduce")
    return replace(program, body=body, collectives=collectives, notes=(*program.notes, *notes))


def _refusal(record: Collective, meta: TensorMeta | None) -> str | None:
    """Why an all-reduce stays on the process group, or None where it goes one-shot."""
    if meta is None or not meta.device.startswith("cuda"):
        return "not a CUDA tensor"
    if record.reduce_op != "sum":
        return f"reduce op '{record.reduce_op}' (one-shot sums only)"
    if record.group_size not in WORLD_SIZES:
        return f"a group of {record.group_size} ranks (one-shot takes {', '.join(map(str, WORLD_SIZES))})"
    if meta.dtype not in DTYPES:
        return f"dtype {meta.dtype} (one-shot takes {', '.join(DTYPES)})"
    if not meta.is_static:
        return "a symbolic size"
    if not meta.is_contiguous() or meta.offset != 0:
        return "not contiguous"
    if tensor_bytes(meta) > ONE_SHOT_MAX_BYTES:
        return f"over {ONE_SHOT_MAX_BYTES // 1024} KiB, where the ring wins"
    return None


def _size(meta: TensorMeta | None) -> str:
    if meta is None or not meta.is_static:
        return "a tensor of symbolic size"
    return f"{tensor_bytes(meta)} bytes" if meta.dtype in ITEMSIZE else f"{meta.numel} elements of {meta.dtype}"
