"""Starting the tensor-parallel benches' ranks (`tp`, `tp_step`): a process per rank, one GPU each over
NCCL (the CPU over gloo), and what rank 0 sends back.

`spawn(target, world, *args)` runs `target(rank, world, port, *args, outbox)` in `world` spawned
processes. A rank sets itself up with `join` and ends with `leave`: rank 0 sends its result before the
group is torn down (that has hung with CUDA graphs holding NCCL work), so the result arrives even where
the teardown does not finish; a rank still tearing down after `TEARDOWN_SECONDS` is killed.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import socket
from collections.abc import Callable
from typing import Any

import torch

# After rank 0's result arrives, for the ranks to leave the group and exit (with CUDA graphs holding NCCL work
# they hang there: on 2 H200s both ranks were killed after a minute, a minute of device time lost).
TEARDOWN_SECONDS = 15
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def keep_multicast_off() -> None:
    """This workplace keeps NVLink multicast off: set the variables that say so where they are unset."""
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)


def spawn(target: Callable[..., None], world: int, *args: Any) -> tuple[Any | None, list[int | None]]:
    """What rank 0 of `target`'s `world` processes sent (None where a rank exited first: its traceback is on
    stderr), once every rank has exited or been killed; and their exit codes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, outbox)) for r in range(world)]
    for p in procs:
        p.start()
    result = _rank0_result(procs, outbox)
    for r, p in enumerate(procs):
        p.join(timeout=TEARDOWN_SECONDS)
        if p.is_alive():
            print(f"  TP={world}: rank {r} still tearing down after {TEARDOWN_SECONDS} s: killed", flush=True)
            p.kill()
            p.join()
    return result, [p.exitcode for p in procs]


def _rank0_result(procs: list[Any], outbox: Any) -> Any | None:
    while True:
        try:
            return outbox.get(timeout=1.0)
        except queue.Empty:
            if any(p.exitcode is not None for p in procs):
                try:
                    return outbox.get(timeout=5.0)
                except queue.Empty:
                    return None


def join(rank: int, world: int, port: int, device_type: str, timeout_s: float = 600) -> torch.device:
    """This rank's device, its process group joined (NCCL on CUDA, gloo on the CPU; none for one rank)."""
    import torch.distributed as dist

    cuda = device_type == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # ranks share the CPU
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if cuda else None)  # fmt: skip
    return device


def leave(rank: int, world: int, outbox: Any, result: Any) -> None:
    """Rank 0 sends `result` (flushed), then every rank leaves the group."""
    import torch.distributed as dist

    if rank == 0:
        outbox.put(result)
        outbox.close()
        outbox.join_thread()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
