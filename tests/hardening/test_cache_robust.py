"""The disk cache under concurrency and damage: two processes writing one entry never leave a torn
file, and a truncated, corrupt, stale or foreign entry is compiled again and overwritten, never loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import opgen
from opgen.bench.models import ReshapeAdd
from opgen.runtime.artifact import cache

WRITER = """
import sys
from pathlib import Path
from opgen.runtime.artifact import cache
from opgen.runtime.artifact.compiled import CompiledGraph
graph = CompiledGraph.from_json(Path(sys.argv[1]).read_text())
role, rounds = sys.argv[2], int(sys.argv[3])
torn = 0
for _ in range(rounds):
    if role == "write":
        assert cache.store(graph) is not None
    else:
        loaded = cache.load(graph.key)
        torn += loaded is not None and loaded != graph
print(f"torn={torn}")
"""


def compile_once() -> Callable[..., torch.Tensor]:
    x, y = torch.ones(16), torch.full((16,), 2.0)
    with torch.no_grad():
        fast = opgen.compile(ReshapeAdd(), (x, y))
        assert torch.equal(fast(x, y), x + y)
    return fast


def test_two_processes_write_one_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "cache"))
    graph = compile_once().artifact
    artifact = tmp_path / "graph.json"
    artifact.write_text(graph.to_json())
    env = {**os.environ, "OPGEN_CACHE_DIR": str(tmp_path / "cache")}  # keeps LD_PRELOAD under make asan
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(artifact), role, "300"], env=env, stdout=subprocess.PIPE, text=True
        )
        for role in ("write", "write", "read", "read")
    ]
    outputs = [child.communicate(timeout=300)[0].strip() for child in children]
    assert [child.returncode for child in children] == [0, 0, 0, 0], outputs
    assert outputs == ["torn=0"] * 4
    entry = cache.entry_dir(graph.key)
    assert sorted(p.name for p in entry.iterdir()) == ["graph.json", "graph.py"]  # no temporary files left
    assert cache.load(graph.key) == graph


def _truncate(text: str) -> str:
    return text[: len(text) // 2]


def _flip_source(text: str) -> str:
    return text.replace("return add(", "return sub(", 1)


DAMAGE = {
    "truncated": _truncate,
    "empty": lambda text: "",
    "corrupt source": _flip_source,
    "no digest": lambda text: text.partition("\n")[2],
    "binary": lambda text: "\x00\xff" * 10,
    "other key": lambda text: text.replace('"key": "', '"key": "0', 1),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    original = compile_once().artifact
    key = original.key
    path = cache.entry_dir(key) / "graph.json"
    good = path.read_text()
    damaged = DAMAGE[damage](good)
    assert damaged != good
    path.write_text(damaged, errors="surrogateescape")
    rebuilt = compile_once()  # checks the result too: a loaded corrupt source would compute x - y
    assert rebuilt.artifact.from_cache is False
    stored = cache.load(key)  # overwritten with a sound entry
    assert stored is not None and stored.source == original.source
    assert compile_once().artifact.from_cache is True


def test_entry_that_is_a_directory_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    key = compile_once().artifact.key
    path = cache.entry_dir(key) / "graph.json"
    path.unlink()
    path.mkdir()
    assert compile_once().artifact.from_cache is False  # neither loaded nor an error
