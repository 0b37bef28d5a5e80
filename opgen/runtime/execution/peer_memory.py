"""The mapped buffers opgen's kernels over peer memory write into (`execution.peer_sum`, `execution.peer_gather`).

A buffer every rank of a group maps (`symm_mem.empty` + `rendezvous`, collective calls: every rank binds
its graphs in the same order) holds two slots, taken in turn, each a part of `words` uint64 words for
every rank. It is zeroed (epoch 0, no call's: `execution.epoch_words`), and every rank waits
(`dist.barrier`) before any rank can write to a peer's. The kernels read it as a table of each rank's
buffer address (int64, on the device).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from opgen.runtime.ir import Collective


@dataclass(frozen=True, slots=True)
class PeerSlots:
    """One mapped buffer: two slots of `world` parts of `words` words, as the kernels' address table."""

    words: int  # uint64 words a rank's part of a slot holds
    addresses: torch.Tensor  # each rank's buffer address (int64, on the device)
    buffer: torch.Tensor  # this rank's mapped buffer, kept alive with whatever holds this
    rank: int
    world: int


def require_jit() -> None:
    """Raise where opgen's JIT cannot launch the kernels: before any collective call, so every rank gives
    up alike."""
    import opgen.jit

    if not opgen.jit.available():
        raise RuntimeError(f"opgen.jit is unavailable ({', '.join(opgen.jit.missing())})")


def cannot_run(spec: Collective, kernel: str, exc: Exception, instead: str) -> None:
    """Warn that opgen's `kernel` cannot run `spec`'s calls, why (`exc`), and what runs them `instead`."""
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    warnings.warn(
        f"opgen: graph node '{spec.node}': opgen's {kernel} kernel cannot run on group '{spec.group}' ({why}); "
        f"{instead}",
        stacklevel=3,
    )


def map_slots(group: Any, words: int, device: torch.device) -> PeerSlots:
    """A zeroed buffer of two slots of `words` words a rank, mapped by every rank of `group` (a collective
    call, which returns once every rank's buffer is zero)."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from opgen.runtime.execution.one_shot import enable_group

    name = str(group.group_name)
    enable_group(name)
    world = dist.get_world_size(group)
    buffer = symm_mem.empty(2 * world * words, dtype=torch.int64, device=device)
    handle = symm_mem.rendezvous(buffer, name)
    buffer.zero_()  # epoch 0: no call's
    torch.cuda.synchronize(device)
    dist.barrier(group=group)  # every rank's buffer is zero before any rank writes to a peer's
    addresses = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
    return PeerSlots(words, addresses, buffer, int(handle.rank), world)
