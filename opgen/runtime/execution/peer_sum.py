"""Binding opgen's one-shot all-reduce (`passes.peer_sum`) to its Triton kernel over peer memory.

Each (group, dtype, device) gets a state when a graph with such an all-reduce is bound. The state holds
a buffer every rank maps (`execution.peer_memory`: a collective call): two slots, each a part for every
rank, of a word for each element of the largest tensor it sums. It also holds this rank's epoch counters
(device memory), one for each program of a call. Graphs bound later share the state where its slots are
large enough; a larger tensor gets a new state (the old one stays with the graphs bound to it).

A call launches a program for every BLOCK elements (`execution.peer_sum_kernel`: each value sent to every
peer in a word with the call's epoch, the peers' words read until they carry it, the ranks' values summed
in rank order) on the current stream through opgen's launcher. It is captured into a CUDA graph like any
other kernel: the epochs live on the device, so replays need no host work. Where opgen's generated
kernels launch dependently (`passes.dependent_launch`), so does this one.

Where opgen's JIT cannot run, the buffers cannot be mapped, or the kernel does not compile, the record
runs as torch's one-shot all-reduce instead (`execution.one_shot`, which falls back to the process
group in turn), with a warning: slower, never wrong. Every rank takes the same path, as every rank
binds the same graphs on the same kind of machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opgen.runtime.execution.peer_memory import PeerLaunchers, PeerState, cannot_run, peer_state, wait_limit_ns
from opgen.runtime.ir import Collective

BLOCK = 1024  # elements a program sums (not yet measured against other sizes)


_STATES: dict[tuple[str, str, str], PeerState] = {}


def issuer(spec: Collective, group: Any, fallback: Callable[[], Callable[[torch.Tensor], None]]
           ) -> Callable[[torch.Tensor], None]:  # fmt: skip
    """The callable of a "peer_sum" record: sums `tensor` over the group, in place, on the current stream.
    `fallback()`: torch's one-shot issuer for the same record, where this kernel cannot run."""
    limit = wait_limit_ns()  # a bad setting is an error, not a fallback
    try:
        state = _state(spec, group)
        launchers = _Launchers(state, limit)
        launchers.kernel(spec.numel).warmup(
            *launchers.arguments(torch.empty(spec.numel, dtype=state.dtype, device=state.counters.device))
        )
    except Exception as exc:  # no JIT, no mapped memory, no compile: torch's one-shot works
        cannot_run(spec, "one-shot all-reduce", exc, "its all-reduces run as torch's one-shot all-reduce instead")
        return fallback()
    return launchers


class _Launchers(PeerLaunchers):
    """Calls the kernel for a tensor, one launcher per element count (the count is a constant of the
    kernel's loops)."""

    def _kernel(self, numel: int) -> Any:
        from opgen.jit.kernels import Config, JitKernel
        from opgen.runtime.execution.peer_sum_kernel import peer_sum_kernel

        s = self.state
        block = min(BLOCK, 1 << max(0, numel - 1).bit_length())
        meta = {**self.meta(numel, block), "BITS": s.dtype.itemsize * 8}
        grid = (-(-numel // block),)
        return JitKernel(peer_sum_kernel, grid, (Config(meta, 4, 1),), mutates=["x", "counters"],
                         dependent_launch=s.dependent)  # fmt: skip

    def arguments(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = self.state
        return (tensor, s.buffers, s.counters)

    def __call__(self, tensor: torch.Tensor) -> None:
        if not tensor.is_contiguous() or tensor.numel() > self.state.words:
            raise RuntimeError(
                f"opgen: a one-shot all-reduce got a tensor of {tensor.numel()} elements "
                f"({'contiguous' if tensor.is_contiguous() else 'not contiguous'}); its buffer holds "
                f"{self.state.words} contiguous ones"
            )
        self.kernel(tensor.numel()).launcher(*self.arguments(tensor))


def _state(spec: Collective, group: Any) -> PeerState:
    """The state of `spec`'s (group, dtype, device): a word an element, a program a BLOCK of them."""
    return peer_state(_STATES, spec, group, spec.numel, BLOCK)
