"""Zoo tests: a private disk cache, one thread, and a clean skip where `transformers` is absent."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _opgen_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "opgen-cache"))


@pytest.fixture(autouse=True, scope="session")
def _threads() -> None:
    torch.set_num_threads(1)
