"""Threads: kernel_ops and one compiled graph called from several threads at once give the results
of eager runs; buffers the memory plan reuses are never shared by concurrent calls; the first call
and a new specialization are safe when several threads make them at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from leak_check import Model

import opgen
from opgen import kernel_ops as k

THREADS = 8


def run_threads(work: Callable[[int], None], threads: int = THREADS) -> None:
    """Runs work(i) in `threads` threads released together; re-raises the first error."""
    barrier, errors = threading.Barrier(threads), []

    def target(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=target, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in pool), "a thread hangs"
    if errors:
        raise errors[0]


def test_kernel_ops_from_threads() -> None:
    shared = torch.randn(32, 32)  # read by every thread

    def work(i: int) -> None:
        own = torch.full((32, 32), float(i))
        out = torch.empty(32, 32)
        for _ in range(200):
            torch.testing.assert_close(k.mm(shared, own), shared @ own)  # releases the GIL
            torch.testing.assert_close(k.add_out(shared, own, out=out), shared + own)
            assert torch.equal(k.sum_dim(own, [0]), own.sum(0))
            parts = k.split(own, 8)
            assert len(parts) == 4 and all(torch.equal(p, own[:8]) for p in parts)

    run_threads(work)


def _inputs(batch: int = 4) -> tuple[torch.nn.Module, list[torch.Tensor], list[torch.Tensor]]:
    model = Model().eval()
    xs = [torch.randn(batch, 16) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in xs]
    return model, xs, expected


def _calls(fast: Any, xs: list[torch.Tensor], expected: list[torch.Tensor], rounds: int) -> Callable[[int], None]:
    def work(i: int) -> None:
        with torch.no_grad():
            for _ in range(rounds):
                torch.testing.assert_close(fast(xs[i]), expected[i])

    return work


def test_compiled_graph_with_reused_buffers_from_threads() -> None:
    model, xs, expected = _inputs()
    with torch.no_grad():
        fast = opgen.compile(model, (xs[0],), cache=False)
    assert "with _lock:" in fast.artifact.source  # the memory plan keeps buffers between calls
    run_threads(_calls(fast, xs, expected, rounds=300))


def test_compiled_graph_without_lock_from_threads() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.reshape(4, 4) + y.reshape(4, 4)).reshape(16) * 2

    xs = [(torch.randn(16), torch.randn(16)) for _ in range(THREADS)]
    with torch.no_grad():
        fast = opgen.compile(f, xs[0], cache=False)

    def work(i: int) -> None:
        for _ in range(300):
            torch.testing.assert_close(fast(*xs[i]), f(*xs[i]))

    run_threads(work)


def test_first_call_from_threads_at_once() -> None:
    """The input check is built by the first call: every thread makes it together."""
    for _ in range(5):
        model, xs, expected = _inputs()
        with torch.no_grad():
            fast = opgen.compile(model, (xs[0],), cache=False)
        run_threads(_calls(fast, xs, expected, rounds=20))


@pytest.mark.parametrize("automatic_dynamic, compiles", [(False, 3), (True, 2)])
def test_new_specialization_from_threads_at_once(automatic_dynamic: bool, compiles: int) -> None:
    """Inputs of new sizes compile a specialization on the slow path; several threads at once."""
    model = Model().eval()
    with torch.no_grad():
        fast = opgen.compile(model, (torch.randn(2, 16),), cache=False, automatic_dynamic=automatic_dynamic)
    xs = [torch.randn(3 + i % 2, 16) for i in range(4)]  # two new shapes, each wanted by two threads
    with torch.no_grad():
        expected = [model(x) for x in xs]
    run_threads(_calls(fast, xs, expected, rounds=5), threads=4)
    # static: one per shape; automatic dynamic: the first plus one dynamic for both new batch sizes,
    # however many threads asked
    assert fast.report().specializations == compiles
