"""Binding a one-shot all-reduce (`passes.one_shot_all_reduce`) to torch's symmetric memory.

Each record gets a buffer every rank of its group maps (`symm_mem.empty` + `rendezvous`, a collective
call: every rank binds its compiled graphs in the same order, as it runs them), allocated when the
graph is bound, so before any CUDA-graph capture. Programs share the buffer of a (group, dtype,
device) where it is large enough. A call copies the local tensor into the buffer, waits for every
rank (a barrier through the buffer's signal pads), sums all ranks' buffers into the tensor itself and
waits again before the buffer is reused: `torch.ops.symm_mem.one_shot_all_reduce_copy_out`, one
kernel on the current stream, captured into a CUDA graph like any other (its barrier flags reset
themselves, so replays need no host work).

Where the buffer cannot be mapped (no peer access between the GPUs, a torch without symmetric memory)
the record runs on the process group instead (`ProcessGroup.allreduce`, waited for at once), with a
warning: slower, never wrong. A tensor whose address the kernel cannot take (not 16-byte aligned)
takes that path for its call too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from opgen.runtime.ir import Collective

_BUFFERS: dict[tuple[str, str, str], torch.Tensor] = {}  # (group, dtype, device) -> the largest mapped buffer


def issuer(spec: Collective, group: Any, on_group: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], None]:
    """The callable of a one-shot record: sums `tensor` over the group, in place, on the current stream.
    `on_group`: the group's own all-reduce of a tensor (returning its Work), where the one-shot cannot run."""

    def nccl(tensor: torch.Tensor) -> None:
        on_group(tensor).wait()

    try:
        buffer = _buffer(spec, group)
    except Exception as exc:  # any reason there is no mapped buffer: the process group works
        warnings.warn(
            f"opgen: graph node '{spec.node}': no symmetric memory for a one-shot all-reduce on group "
            f"'{spec.group}' ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "its all-reduces run on the process group instead",
            stacklevel=2,
        )
        return nccl
    op = torch.ops.symm_mem.one_shot_all_reduce_copy_out.default
    name = str(group.group_name)
    views: dict[tuple[int, ...], torch.Tensor] = {}

    def one_shot(tensor: torch.Tensor) -> None:
        if tensor.data_ptr() % 16:
            return nccl(tensor)
        shape = tuple(tensor.shape)
        view = views.get(shape)
        if view is None:
            view = views[shape] = buffer[: tensor.numel()].view(shape)
        op(view, tensor, "sum", name, tensor)
        return None

    return one_shot


def _buffer(spec: Collective, group: Any) -> torch.Tensor:
    """A mapped buffer of at least `spec.numel` elements of `spec.dtype` on this rank's current device."""
    import torch.distributed._symmetric_memory as symm_mem

    dtype = getattr(torch, spec.dtype.removeprefix("torch."))
    device = torch.device("cuda", torch.cuda.current_device())
    key = (str(group.group_name), spec.dtype, str(device))
    held = _BUFFERS.get(key)
    if held is not None and held.numel() >= spec.numel:
        return held
    numel = max(spec.numel, held.numel() * 2 if held is not None else 0)
    buffer = symm_mem.empty(numel, dtype=dtype, device=device)
    enable_group(group.group_name)
    symm_mem.rendezvous(buffer, group.group_name)
    _BUFFERS[key] = buffer
    return buffer


def enable_group(name: str) -> None:
    """Symmetric memory enabled for the group `name` (needed before torch 2.9, a deprecated no-op after)."""
    import torch.distributed._symmetric_memory as symm_mem

    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(name)
