"""Binding a program's collectives to live process groups, when the compiled function is bound.

Each `Collective` record becomes a callable that calls the process group's C++ API through its
pybind11 binding (`ProcessGroup.allreduce([t], opts)` and friends return a C++ `Work`), exactly as
`torch/csrc/distributed/c10d/Functional.cpp` calls `group->allreduce(...)` for
`_c10d_functional.all_reduce`: no `torch.ops`, no Python collective API, no work registry (the
generated code holds the Work in a local and hands it to the wait). Options objects are built once
here. The group is found by the name the graph recorded (`_resolve_process_group`) and must have
the size the graph was traced for; otherwise `ProcessGroupError` says what is wrong.

Why Python callables and not C++ FASTCALL functions: a collective costs tens of microseconds on the
CPU (gloo) and at least several on the GPU, against well under one for the Python call around the
pybind11 one; in CUDA-graph mode the calls are captured and replayed with no Python at all. The
C++ route would add a c10d translation unit to everyone's build for no measurable gain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch

from opgen.runtime.errors import OpgenError
from opgen.runtime.ir import Collective


class ProcessGroupError(OpgenError, RuntimeError):
    """A compiled graph's collectives cannot run here: no process group, another one, or another size."""


def bindings(specs: Iterable[Collective]) -> dict[str, Callable[..., Any]]:
    """Local name -> callable for each record; every group resolved (and checked) once."""
    groups: dict[str, Any] = {}
    bound: dict[str, Callable[..., Any]] = {}
    for spec in specs:
        if spec.kind == "wait":
            bound[spec.local] = wait
            continue
        if spec.group not in groups:
            groups[spec.group] = resolve(spec)
        check_size(spec, groups[spec.group])
        bound[spec.local] = issuer(spec, groups[spec.group])
    return bound


def wait(work: Any, *in_flight: torch.Tensor) -> None:
    """Wait for a collective; `in_flight` (its tensors) only keeps them alive and in use until here."""
    work.wait()


def resolve(spec: Collective) -> Any:
    """The live process group named `spec.group`, or a `ProcessGroupError` saying why there is none."""
    import torch.distributed as dist

    where = f"graph node '{spec.node}' runs {spec.kind} on process group '{spec.group}'"
    if not dist.is_available():
        raise ProcessGroupError(f"{where}, but this torch build has no torch.distributed")
    if not dist.is_initialized():
        raise ProcessGroupError(
            f"{where}, but no process group is initialised in this process: call "
            "torch.distributed.init_process_group(...) before compiling or loading the model"
        )
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        return _resolve_process_group(spec.group)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ProcessGroupError(f"{where}, but this process has no group of that name ({exc})") from None


def check_size(spec: Collective, group: Any) -> None:
    if spec.group_size is not None and group.size() != spec.group_size:
        raise ProcessGroupError(
            f"graph node '{spec.node}' was compiled for a process group of {spec.group_size} ranks, but group "
            f"'{spec.group}' here has {group.size()}: compile the model again in this set-up"
        )


def reduce_op(name: str) -> Any:
    from torch.distributed import ReduceOp

    ops = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
           "max": ReduceOp.MAX, "band": ReduceOp.BAND, "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR}  # fmt: skip
    return ops[name]


def issuer(spec: Collective, group: Any) -> Callable[..., Any]:
    """The callable of one record: its outputs (and inputs) in, the C++ Work out."""
    from torch._C import _distributed_c10d as c10d

    match spec.kind:
        case "all_reduce":
            opts = c10d.AllreduceOptions()
            opts.reduceOp = reduce_op(spec.reduce_op)
            allreduce = group.allreduce
            return lambda tensor: allreduce([tensor], opts)
        case "all_reduce_coalesced":
            copts = c10d.AllreduceCoalescedOptions()
            copts.reduceOp = reduce_op(spec.reduce_op)
            coalesced = group.allreduce_coalesced
            return lambda tensors: coalesced(list(tensors), copts)
        case "all_gather":
            gather = group._allgather_base
            gopts = c10d.AllgatherOptions()
            return lambda out, tensor: gather(out, tensor, gopts)
        case "all_gather_coalesced":
            gather_many = group.allgather_into_tensor_coalesced
            gopts = c10d.AllgatherOptions()
            return lambda outs, tensors: gather_many(list(outs), list(tensors), gopts)
        case "reduce_scatter":
            ropts = c10d.ReduceScatterOptions()
            ropts.reduceOp = reduce_op(spec.reduce_op)
            scatter = group._reduce_scatter_base
            return lambda out, tensor: scatter(out, tensor, ropts)
        case "reduce_scatter_coalesced":
            ropts = c10d.ReduceScatterOptions()
            ropts.reduceOp = reduce_op(spec.reduce_op)
            scatter_many = group.reduce_scatter_tensor_coalesced
            return lambda outs, tensors: scatter_many(list(outs), list(tensors), ropts)
        case "all_to_all":
            aopts = c10d.AllToAllOptions()
            alltoall = group.alltoall_base
            return lambda out, tensor, out_splits, in_splits: alltoall(
                out, tensor, list(out_splits), list(in_splits), aopts
            )
        case "one_shot_all_reduce":
            from opgen.runtime.execution.one_shot import issuer as one_shot

            return one_shot(spec, group, issuer(replace(spec, kind="all_reduce"), group))
        case "peer_sum":
            from opgen.runtime.execution.peer_sum import issuer as peer_sum

            return peer_sum(spec, group, lambda: issuer(replace(spec, kind="one_shot_all_reduce"), group))
        case "peer_gather":
            from opgen.runtime.execution.peer_gather import issuer as peer_gather

            return peer_gather(spec, group, issuer(replace(spec, kind="all_gather"), group))
        case "broadcast":
            bopts = c10d.BroadcastOptions()
            bopts.rootRank = spec.root
            broadcast = group.broadcast
            return lambda tensor: broadcast([tensor], bopts)
    raise ProcessGroupError(f"graph node '{spec.node}': unknown collective kind '{spec.kind}'")
