"""Binding opgen's one-shot all-gather (`passes.peer_gather`) to its Triton kernel over peer memory.

Each (group, dtype, device) gets a state when a graph with such an all-gather is bound. The state holds a
buffer every rank maps (`execution.peer_memory`: a collective call): two slots, each a part for every
rank of a word for each 32 bits of the largest tensor it sends (two values of a 16-bit dtype, one
float32), rounded up to whole programs. It also holds this rank's epoch counter of each program (device
memory). Graphs bound later share the state where its slots are large enough; a larger tensor gets a new
state (the old one stays with the graphs bound to it).

A call launches a program for each `WORDS` words of the tensor (`execution.peer_gather_kernel`) on the
current stream through opgen's launcher. It is captured into a CUDA graph like any other kernel: the
epochs live on the device, so replays need no host work. Where opgen's generated kernels launch
dependently (`passes.dependent_launch`), so does this one.

Where opgen's JIT cannot run, the buffers cannot be mapped, or the kernel does not compile, the record
runs on the process group instead (its all-gather, waited for at once on the stream), with a warning:
slower, never wrong. Every rank takes the same path, as every rank binds the same graphs on the same
kind of machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opgen.runtime.execution.peer_memory import PeerLaunchers, PeerState, cannot_run, peer_state, wait_limit_ns
from opgen.runtime.ir import Collective

WORDS = 1024  # words a program sends each peer: 2048 values of a 16-bit dtype, or 1024 float32


_STATES: dict[tuple[str, str, str], PeerState] = {}


def issuer(spec: Collective, group: Any, on_group: Callable[[torch.Tensor, torch.Tensor], Any]
           ) -> Callable[[torch.Tensor, torch.Tensor], None]:  # fmt: skip
    """The callable of a "peer_gather" record: gathers every rank's `tensor` into `out`, on the current
    stream. `on_group`: the group's own all-gather (returning its Work), where this kernel cannot run."""

    def nccl(out: torch.Tensor, tensor: torch.Tensor) -> None:
        on_group(out, tensor).wait()

    limit = wait_limit_ns()  # a bad setting is an error, not a fallback
    try:
        state = _state(spec, group)
        launchers = _Launchers(state, limit)
        tensor = torch.empty(spec.numel, dtype=state.dtype, device=state.counters.device)
        out = tensor.new_empty(state.world * spec.numel)
        launchers.kernel(spec.numel).warmup(*launchers.arguments(out, tensor))
    except Exception as exc:  # no JIT, no mapped memory, no compile: the process group works
        cannot_run(spec, "one-shot all-gather", exc, "its all-gathers run on the process group instead")
        return nccl
    return launchers


class _Launchers(PeerLaunchers):
    """Calls the kernel for a tensor, one launcher per element count (the count is a constant of the
    kernel, and sets its grid)."""

    def _kernel(self, numel: int) -> Any:
        from opgen.jit.kernels import Config, JitKernel
        from opgen.runtime.execution.peer_gather_kernel import peer_gather_kernel

        s = self.state
        block = WORDS * _pack(s.dtype)
        meta = {**self.meta(numel, block), "PACK": _pack(s.dtype)}
        grid = (max(1, -(-numel // block)),)
        return JitKernel(peer_gather_kernel, grid, (Config(meta, 4, 1),), mutates=["out", "counters"],
                         dependent_launch=s.dependent)  # fmt: skip

    def arguments(self, out: torch.Tensor, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = self.state
        return (tensor, out, s.buffers, s.counters)

    def __call__(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        s = self.state
        numel = tensor.numel()
        if not tensor.is_contiguous() or numel > s.words * _pack(s.dtype) or tensor.dtype != s.dtype:
            raise RuntimeError(
                f"opgen: a one-shot all-gather got a tensor of {numel} elements of {tensor.dtype} "
                f"({'contiguous' if tensor.is_contiguous() else 'not contiguous'}); its buffer holds "
                f"{s.words * _pack(s.dtype)} contiguous ones of {s.dtype}"
            )
        if not out.is_contiguous() or out.numel() != s.world * numel or out.dtype != s.dtype:
            raise RuntimeError(
                f"opgen: a one-shot all-gather of {numel} elements over {s.world} ranks got an output of "
                f"{out.numel()} elements of {out.dtype} ({'contiguous' if out.is_contiguous() else 'not contiguous'})"
            )
        self.kernel(numel).launcher(*self.arguments(out, tensor))


def _pack(dtype: torch.dtype) -> int:
    """Values a word carries: 32 bits of them."""
    return 4 // dtype.itemsize


def _state(spec: Collective, group: Any) -> PeerState:
    """The state of `spec`'s (group, dtype, device): a word each 32 bits of the tensor, a program `WORDS` of
    them (so every part starts at an even word)."""
    dtype = getattr(torch, spec.dtype.removeprefix("torch."))
    return peer_state(_STATES, spec, group, -(-spec.numel // _pack(dtype)), WORDS)
