"""Runtime tests: a private disk cache per test session, and one thread (as the benchmark runs)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _opgen_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "opgen-cache"))
    monkeypatch.delenv("OPGEN_DEBUG", raising=False)


@pytest.fixture(autouse=True, scope="session")
def _threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def registry():
    from opgen.runtime.pipeline import default_registry

    return default_registry()
