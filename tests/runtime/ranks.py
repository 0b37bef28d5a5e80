"""Ranks for the multi-process tests: `world` processes in one process group, each running the cases
(functions of a cases module, by name) it is sent, every case bounded in time.

A pair of ranks is started once per test module; a hang or a dead rank fails the test and the ranks
are started again for the next one. gloo on 127.0.0.1 (`test_distributed.py`), or NCCL with one GPU
per rank (`test_distributed_nccl.py`).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import queue
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

CASE_SECONDS = 50  # one case in every rank; tests run well under a minute


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(rank: int, world: int, port: int, setup: tuple[str, str, str], inbox: Any, outbox: Any) -> None:
    """One rank: join the group, then run each case name it is sent until it is sent None."""
    import datetime
    import os

    cache, backend, module = setup
    os.environ["OPGEN_CACHE_DIR"] = cache
    cases = importlib.import_module(module).CASES
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=CASE_SECONDS),
    )  # fmt: skip
    try:
        while (name := inbox.get()) is not None:
            try:
                outbox.put((rank, "ok", cases[name](rank, world)))
            except BaseException:  # sent to the test, which fails with it
                outbox.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class Ranks:
    """`world` processes in one group, each running the cases of `module` it is sent."""

    def __init__(self, world: int, cache: str, backend: str = "gloo", module: str = "distributed_cases") -> None:
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.procs = [
            ctx.Process(
                target=_serve,
                args=(r, world, port, (cache, backend, module), self.inboxes[r], self.outbox),
                daemon=True,
            )
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(self, case: str, timeout: float = CASE_SECONDS) -> list[Any]:
        """Each rank's result, by rank; a rank's exception fails the test with its traceback."""
        for box in self.inboxes:
            box.put(case)
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(results) < len(self.procs):
            try:
                rank, status, value = self.outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.close()
                    why = f"{', '.join(dead)} died" if dead else f"it did not finish in {timeout:g} s"
                    pytest.fail(f"case {case!r} failed: {why} (ranks stopped)")
                continue
            if status == "error":
                self.close()
                pytest.fail(f"case {case!r} failed in rank {rank}:\n{value}")
            results[rank] = value
        return [results[r] for r in range(len(self.procs))]

    def close(self) -> None:
        for box in self.inboxes:
            box.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


def started(world: int, cache: str, backend: str = "gloo", module: str = "distributed_cases") -> Iterator[Any]:
    """A module fixture's body: ranks that are started again if a failed case killed them."""
    holder = [Ranks(world, cache, backend, module)]

    def get() -> Ranks:
        if not holder[0].alive():
            holder[0].close()
            holder[0] = Ranks(world, cache, backend, module)
        return holder[0]

    yield _Lazy(get)
    holder[0].close()


class _Lazy:
    """The module's ranks, started again if a failed case killed them."""

    def __init__(self, get: Any) -> None:
        self._get = get

    def run(self, case: str, timeout: float = CASE_SECONDS) -> list[Any]:
        return self._get().run(case, timeout)


def spawned(target: Callable[..., None], arguments: list[tuple[Any, ...]], seconds: float) -> list[Any]:
    """`target(*args, out)` in a spawned process for each `args` (no process group: kernels in Triton's
    interpreter, ranks sharing memory); what each put on the queue `out`, sorted. A process still alive
    after `seconds` is killed, and the test fails on the queue's `Empty`."""
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=target, args=(*args, out)) for args in arguments]
    for process in processes:
        process.start()
    try:
        return sorted(out.get(timeout=seconds) for _ in processes)
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
