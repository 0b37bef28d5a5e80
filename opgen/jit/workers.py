"""Compile workers: Triton compiles of opgen's generated kernels, several at once, in other processes.

A model's first call compiles every fused kernel in each of its configs (EfficientNet-B0: about 60
kernels, 3 configs each); one after another in the calling process that is most of the first call.
Triton's compile holds the GIL for much of its work, so threads do not help; like Inductor, opgen
hands them to worker processes. Each worker runs `opgen/jit/worker.py` as a script, which imports
triton but neither torch nor opgen, and is kept for the life of the process.

Only kernels opgen generated go to workers: their modules are files in the JIT cache holding
nothing but the kernel, so a worker can import them. A user's kernel compiles in the calling
process, as does everything when a worker cannot start or dies (the compile then runs here).
`OPGEN_COMPILE_WORKERS=N` sets how many run (default: every core but one, at most 16; 0: none). The
calling process mostly waits for them meanwhile; Inductor's pool also takes every core.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from opgen.jit import cache

WORKER = Path(__file__).with_name("worker.py")
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
MAX_WORKERS = 16
# Seconds a closing pool waits, all its workers together, for them to end at EOF before it kills the rest: a
# process exits in that time, whatever the count (each waited 5 s in turn before: a GPU test run's 16 processes
# with 15 workers each were still closing them when the run's time limit stopped it).
CLOSE_SECONDS = 2.0


class WorkerDied(Exception):
    """A worker could not start or stopped answering: the compile runs in this process instead."""


def count() -> int:
    """How many workers to run (`OPGEN_COMPILE_WORKERS`, else every core but one, at most 16)."""
    text = os.environ.get("OPGEN_COMPILE_WORKERS", "").strip()
    if text:
        try:
            return max(0, int(text))
        except ValueError:
            raise ValueError(f"OPGEN_COMPILE_WORKERS must be a whole number of workers, got {text!r}") from None
    return min(MAX_WORKERS, max(1, (os.cpu_count() or 1) - 1))


def generated_file(fn: Any) -> str | None:
    """The module file of a @triton.jit function opgen generated (in the JIT cache), else None."""
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    path = Path(code.co_filename) if code is not None else None
    if path is None or not path.is_file():
        return None
    try:
        path.resolve().relative_to(cache.jit_dir().resolve())
    except ValueError:
        return None
    return str(path)


class _Worker:
    def __init__(self) -> None:
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise WorkerDied(f"could not start a compile worker: {exc}") from exc

    def run(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            pickle.dump(request, self.process.stdin)
            self.process.stdin.flush()
            reply: tuple[str, Any] = pickle.load(self.process.stdout)  # noqa: S301 (our own worker, over a pipe)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            self.close()
            raise WorkerDied(f"a compile worker stopped ({type(exc).__name__})") from exc
        return reply

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        self.stop()
        self.finish(timeout)

    def stop(self) -> None:
        """Close its stdin: the worker's loop ends at EOF."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass

    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for it to end, then kill it."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Pool:
    """Up to `size` workers, started as they are first needed (or all at once, `warm`); each compile
    takes an idle one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._running = 0
        self._ready = threading.Condition()

    def compile(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        worker = self._acquire()
        try:
            reply = worker.run(request)
        except WorkerDied:
            self._gone()
            raise
        self._put_back(worker)
        return reply

    def warm(self) -> None:
        """Start every worker not yet started, on a background thread, so that the compiles of a
        model's first call find them up (each has imported Triton by then)."""
        threading.Thread(target=self._start_all, name="opgen-jit-warm", daemon=True).start()

    def _start_all(self) -> None:
        while self._reserve():
            try:
                worker = self._start()
            except WorkerDied:
                return
            self._put_back(worker)

    def _reserve(self) -> bool:
        """A place for one more worker, if the pool has one."""
        with self._ready:
            if self._running >= self.size:
                return False
            self._running += 1
            return True

    def _put_back(self, worker: _Worker) -> None:
        with self._ready:
            self._idle.append(worker)
            self._ready.notify()

    def _acquire(self) -> _Worker:
        with self._ready:
            while not self._idle and self._running >= self.size:
                self._ready.wait()
            if self._idle:
                return self._idle.pop()
            self._running += 1
        return self._start()

    def _start(self) -> _Worker:
        """A new worker, in a place already reserved (given back if the worker cannot start)."""
        try:
            return _Worker()
        except WorkerDied:
            self._gone()
            raise

    def _gone(self) -> None:
        """A worker that failed to start or died: its place goes to the next compile."""
        with self._ready:
            self._running -= 1
            self._ready.notify()

    def close(self) -> None:
        """End the idle workers: each told at once, then CLOSE_SECONDS for all of them together."""
        with self._ready:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()
        deadline = time.monotonic() + CLOSE_SECONDS
        for worker in idle:
            worker.finish(max(0.0, deadline - time.monotonic()))


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = Pool(max(count(), 1))
            atexit.register(_POOL.close)
        return _POOL


def warm() -> None:
    """Start the workers now, in the background. `opgen.compile` calls this before torch.export when
    the graph will get Triton kernels: a worker takes about a second to start (Python, then Triton),
    which then overlaps the export instead of delaying the first call's compiles."""
    if count() > 0:
        pool().warm()
