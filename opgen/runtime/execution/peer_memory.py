"""The mapped buffers opgen's kernels over peer memory write into (`execution.peer_sum`, `execution.peer_gather`).

A buffer every rank of a group maps (`symm_mem.empty` + `rendezvous`, collective calls: every rank binds
its graphs in the same order) holds two slots, taken in turn, each a part of `words` uint64 words for
every rank. It is zeroed (epoch 0, no call's: `execution.epoch_words`), and every rank waits
(`dist.barrier`) before any rank can write to a peer's. The kernels read it as a table of each rank's
buffer address (int64, on the device). Each (group, dtype, device) keeps one such buffer and this rank's
epoch counters, one a program, in a `PeerState` (`peer_state`), which graphs bound later share where its
parts are large enough.

A kernel waits for its peers' words for at most `OPGEN_PEER_TIMEOUT_S` seconds (`wait_limit_ns`; 600 by
default, a NCCL process group's default timeout; 0 waits for ever). Past it, it traps (`epoch_words.gone`): the
process's next CUDA call raises, where waiting would hang for ever on a rank that died.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable
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


TIMEOUT_ENV = "OPGEN_PEER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0  # as a NCCL process group's default timeout


def wait_limit_ns() -> int:
    """How long a kernel waits for a peer's words before it stops (`epoch_words.arrived`), in nanoseconds,
    from `OPGEN_PEER_TIMEOUT_S` (seconds; 0: for ever). A value that is no number of seconds is a ValueError
    when a graph is bound, before any collective call, so every rank fails alike."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and 0 <= seconds <= 1e9):
        raise ValueError(f"opgen: {TIMEOUT_ENV}={raw!r}: give the seconds a kernel over peer memory waits for its "
                         f"peers (0 waits for ever; {DEFAULT_TIMEOUT_S:g} by default)")  # fmt: skip
    return round(seconds * 1e9)


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
    # every rank's buffer is zero before any rank writes to a peer's; on this device (without `device_ids` a
    # group set up without a device warns that it guesses the current one)
    dist.barrier(group=group, device_ids=[device.index])
    addresses = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
    return PeerSlots(words, addresses, buffer, int(handle.rank), world)


@dataclass
class PeerState:
    """One (group, dtype, device)'s mapped buffer and this rank's epoch counters, as a kernel reads them."""

    words: int  # uint64 words a rank's part of a slot holds, whole programs
    dtype: torch.dtype
    buffers: torch.Tensor  # each rank's buffer address (int64, on the device)
    counters: torch.Tensor  # this rank's last epoch of each program (int32, on the device)
    held: tuple[torch.Tensor, ...]  # the mapped tensors, kept alive with the state
    rank: int
    world: int
    dependent: bool  # launched dependently, as opgen's generated kernels are (`device_facts`)


def peer_state(states: dict[tuple[str, str, str], PeerState], spec: Collective, group: Any, words: int,
               program_words: int) -> PeerState:  # fmt: skip
    """The state in `states` of `spec`'s (group, dtype, device) where its parts hold `words` words. Where
    none does, a new one (of whole programs of `program_words` words, at least twice the old one's: graphs
    bound to the old one keep it), mapped now: a collective call, so every rank binds in the same order."""
    from opgen.runtime.execution.device_facts import device_facts

    require_jit()
    device = torch.device("cuda", torch.cuda.current_device())
    key = (str(group.group_name), spec.dtype, str(device))
    held = states.get(key)
    if held is not None and held.words >= words:
        return held
    size = max(-(-words // program_words) * program_words, held.words * 2 if held is not None else 0)
    mapped = map_slots(group, size, device)
    state = PeerState(
        words=mapped.words,
        dtype=getattr(torch, spec.dtype.removeprefix("torch.")),
        buffers=mapped.addresses,
        counters=torch.zeros(mapped.words // program_words, dtype=torch.int32, device=device),
        held=(mapped.buffer,),
        rank=mapped.rank,
        world=mapped.world,
        dependent=device_facts().dependent_launch,
    )
    states[key] = state
    return state


class PeerLaunchers:
    """What the launchers of a kernel over peer memory share: its state, how long it waits for a peer
    (`wait_limit_ns`), and a kernel per element count (`_kernel`, cached: the count is a constant of the
    kernel)."""

    def __init__(self, state: PeerState, limit_ns: int) -> None:
        self.state = state
        self.limit_ns = limit_ns
        self.kernel: Callable[[int], Any] = functools.cache(self._kernel)

    def _kernel(self, numel: int) -> Any:
        """The kernel for tensors of `numel` elements (its `JitKernel`; `.launcher` launches it)."""
        raise NotImplementedError

    def meta(self, numel: int, block: int) -> dict[str, Any]:
        """The constants every such kernel takes, for tensors of `numel` elements in programs of `block`."""
        from opgen.runtime.execution.epoch_words import EPOCHS  # imports triton: only once a kernel is built

        s = self.state
        return {"NUMEL": numel, "RANK": s.rank, "WORLD": s.world, "SLOT": s.words, "EPOCHS": EPOCHS, "BLOCK": block,
                "DEPENDENT": s.dependent, "TIMEOUT_NS": self.limit_ns}  # fmt: skip
