"""Compile workers (`opgen.jit.workers`): generated kernels compile in other processes, several at once.

Triton compiles for a CUDA target without a GPU (its wheel brings ptxas), so where triton is installed
these run on the CPU machine too; where it is not, only the parts that need no compile run.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opgen.jit import worker, workers

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

SOURCE = """import triton
import triton.language as tl


@triton.jit
def double(x, y, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs) * 2)


@triton.jit
def broken(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), tl.no_such_function(1))
"""


@pytest.fixture
def generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kernel module where opgen writes generated ones (the JIT cache of a fresh cache folder)."""
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    path = tmp_path / "jit" / "fused" / "double_0.py"
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE)
    return path


@pytest.fixture
def pool() -> Iterator[workers.Pool]:
    """A pool of one worker, closed after the test."""
    started = workers.Pool(1)
    yield started
    started.close()


def request(path: Path, name: str = "double", block: int = 256) -> tuple:  # type: ignore[type-arg]
    from triton.backends.compiler import GPUTarget

    signature = (
        {"x": "*fp32", "y": "*fp32", "BLOCK": "constexpr"} if name == "double" else {"x": "*fp32", "BLOCK": "constexpr"}
    )
    at = len(signature) - 1
    return (str(path), name, signature, {(at,): block}, {}, 4, 1, GPUTarget("cuda", 90, 32))


def test_the_worker_count_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_COMPILE_WORKERS", "3")
    assert workers.count() == 3
    monkeypatch.setenv("OPGEN_COMPILE_WORKERS", "0")
    assert workers.count() == 0
    monkeypatch.setenv("OPGEN_COMPILE_WORKERS", "many")
    with pytest.raises(ValueError, match="OPGEN_COMPILE_WORKERS must be a whole number"):
        workers.count()
    monkeypatch.delenv("OPGEN_COMPILE_WORKERS")
    assert 0 <= workers.count() <= workers.MAX_WORKERS


@needs_triton
def test_only_kernels_opgen_generated_go_to_workers(generated: Path) -> None:
    fn = worker.load_kernel(str(generated), "double")
    assert workers.generated_file(fn) == str(generated)
    here = worker.load_kernel(str(Path(__file__).with_name("kernels_for_tests.py")), "axpy_kernel")
    assert workers.generated_file(here) is None  # a user's kernel: compiled in the calling process


@needs_triton
def test_workers_compile_what_this_process_compiles(generated: Path) -> None:
    pool = workers.Pool(2)
    try:
        requests = [request(generated, block=b) for b in (128, 256, 512, 1024)]
        with concurrent.futures.ThreadPoolExecutor(4) as threads:  # more compiles than workers: they queue
            replies = list(threads.map(pool.compile, requests))
        assert [status for status, _ in replies] == ["ok"] * 4
        here = worker.compile_fields(worker.load_kernel(*requests[1][:2]), *requests[1][2:])
        there = replies[1][1]
        assert there["name"] == here["name"] == "double" and there["cubin"] and there["arch"] == here["arch"]
        assert (there["num_warps"], there["shared"]) == (here["num_warps"], here["shared"])
        assert len(pool._idle) <= 2
    finally:
        pool.close()


@needs_triton
def test_a_compile_error_comes_back_as_a_message(generated: Path, pool: workers.Pool) -> None:
    status, message = pool.compile(request(generated, "broken"))
    assert status == "error" and "no_such_function" in message
    assert pool.compile(request(generated))[0] == "ok"  # the worker lives on


@needs_triton
def test_a_worker_that_dies_is_replaced(generated: Path, pool: workers.Pool) -> None:
    assert pool.compile(request(generated))[0] == "ok"
    (dead,) = pool._idle
    dead.process.kill()
    dead.process.wait()
    with pytest.raises(workers.WorkerDied):
        pool.compile(request(generated))
    assert pool.compile(request(generated))[0] == "ok"  # a fresh worker


def _started(pool: workers.Pool, count: int) -> bool:
    deadline = time.monotonic() + 60
    while len(pool._idle) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(pool._idle) == count


def test_warm_starts_every_worker_once_in_the_background() -> None:
    pool = workers.Pool(2)
    try:
        pool.warm()
        pool.warm()  # a second warm starts none beyond the pool's size
        assert _started(pool, 2)
        assert pool._running == 2
    finally:
        pool.close()


@needs_triton
def test_a_warmed_worker_compiles(generated: Path, pool: workers.Pool) -> None:
    pool.warm()
    assert _started(pool, 1)
    assert pool.compile(request(generated))[0] == "ok"
    assert pool._running == 1  # the compile took the warm worker, it started no other


def test_closing_waits_for_all_workers_together_then_kills_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that never read their stdin (still importing Triton on a busy host): the pool's close, as at
    exit, takes about CLOSE_SECONDS for all of them, not a timeout each, and leaves none running."""
    monkeypatch.setattr(workers, "_BOOT", "import time; time.sleep(60)")
    pool = workers.Pool(3)
    pool.warm()
    assert _started(pool, 3)
    processes = [w.process for w in pool._idle]
    start = time.monotonic()
    pool.close()
    assert time.monotonic() - start < workers.CLOSE_SECONDS + 1.5
    assert all(p.poll() is not None for p in processes) and not pool._idle
