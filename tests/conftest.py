"""Fixtures shared by the CPU and GPU test directories."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def user_kernels_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example project of your own kernels (opgen/examples/user_kernels), built once per test run:
    under pytest-xdist the workers share one build (the run's temporary root, under a file lock)."""
    from opgen.examples import build_user_kernels

    base = tmp_path_factory.getbasetemp()
    root = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    with open(root / "user_kernels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds; the others find it built (ninja: no work)
        return build_user_kernels(root / "user_kernels_build")


@pytest.fixture
def reader_gone() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs `python -m <module> <args>` with its output to a pipe whose reader closed it before the first line
    (`... | head -1` once head has gone); stderr captured."""

    def run(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
        read, write = os.pipe()
        os.close(read)
        try:
            return subprocess.run([sys.executable, "-m", module, *argv], stdout=write, stderr=subprocess.PIPE,
                                  text=True, timeout=300, cwd=Path(__file__).parent)  # fmt: skip
        finally:
            os.close(write)

    return run


@pytest.fixture(scope="module")
def cudnn_exact() -> Iterator[None]:
    """cuDNN without TF32: with it (torch's default) two equal convolutions may differ, and folding
    batch norm into ResNet-18's weights moves its logits by about 1e-2 instead of about 1e-5."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With OPGEN_FAILURE_LOG set, append each failure (test id and message) to that file as it happens.

    `make test-gpu` reads it: a run cut short by its time limit still shows what failed before then.
    Under pytest-xdist the controller receives every worker's reports, so one file holds them all.
    """
    path = os.environ.get("OPGEN_FAILURE_LOG")
    if not path or not report.failed or "PYTEST_XDIST_WORKER" in os.environ:  # a worker: the controller writes
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"=== FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
