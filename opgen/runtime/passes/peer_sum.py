"""The smallest one-shot all-reduces through opgen's own Triton kernel over peer memory.

`one_shot_all_reduce` sends decode's small all-reduces through torch's symmetric-memory kernel, which
copies the tensor into a mapped buffer, waits for every rank, sums every rank's buffer and waits again
before the buffer may be written by the next call: two barriers. opgen's kernel
(`execution.peer_sum_kernel`) keeps two slots a rank and takes them in turn, so one barrier suffices,
and runs as one program, all a message of a few KB needs. Replayed in a CUDA graph of 32 all-reduces
back to back on 2 H200s (`docs/distributed.md`), us an all-reduce, opgen's against torch's: 4.14 against
6.41 at 4 KB (bfloat16), 4.77 against 6.63 at 8 KB, 10.06 against 7.35 at 32 KB.

A record of kind "one_shot_all_reduce" (one per group and dtype) becomes "peer_sum" where its largest
tensor holds at most `PEER_SUM_MAX_BYTES`: past it one program's copies and sums take longer than
torch's kernel, whose programs spread over the GPU. The report says which records changed. Leaving this
pass out of `passes=` keeps torch's kernel; where opgen's JIT cannot run when the graph is bound, the
record runs as torch's kernel too (`execution.peer_sum`), with a warning.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import ITEMSIZE, Program
from opgen.runtime.registry import KernelRegistry

PEER_SUM_MAX_BYTES = 16 * 1024  # 8 KB measured faster than torch's kernel, 32 KB slower


def peer_sums(program: Program, registry: KernelRegistry) -> Program:
    changed, notes = [], []
    for record in program.collectives:
        size = record.numel * ITEMSIZE.get(record.dtype, 4)
        if record.kind == "one_shot_all_reduce" and size <= PEER_SUM_MAX_BYTES:
            changed.append(replace(record, kind="peer_sum"))
            notes.append(f"one-shot all-reduces of group '{record.group}' ({record.dtype}, up to {size} bytes): "
                         "opgen's one-barrier kernel (`peer_sum`)")  # fmt: skip
        else:
            changed.append(record)
    if not notes:
        return program
    return replace(program, collectives=tuple(changed), notes=(*program.notes, *notes))
