"""The disk cache: a second process loads the compiled graph instead of generating it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opgen.runtime.artifact import cache
from opgen.runtime.artifact.compiled import CompiledGraph

SCRIPT = """
import json, torch, opgen
from opgen.bench.models import ReshapeAdd
with torch.no_grad():
    x, y = torch.randn(16), torch.randn(16)
    compiled = opgen.compile(ReshapeAdd(), (x, y))
    ok = bool(torch.equal(compiled(x, y), (x + y)))
graph = compiled.artifact
print(json.dumps({"key": graph.key, "from_cache": graph.from_cache, "report": compiled.report().from_cache, "ok": ok}))
"""


def run_in_fresh_process(cache_dir: Path) -> dict:
    env = {**os.environ, "OPGEN_CACHE_DIR": str(cache_dir)}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_second_process_skips_codegen(tmp_path: Path) -> None:
    first = run_in_fresh_process(tmp_path)
    second = run_in_fresh_process(tmp_path)
    assert first["ok"] and second["ok"]
    assert first["from_cache"] is False and second["from_cache"] is True and second["report"] is True
    assert first["key"] == second["key"]
    entry = tmp_path / first["key"][:2] / first["key"]
    assert "add(x, y)  # add: aten.add.Tensor" in (entry / "graph.py").read_text()
    stored = CompiledGraph.from_json((entry / "graph.json").read_text().partition("\n")[2])  # after the digest
    assert stored.key == first["key"] and stored.kernels == ("add",)


def test_key_covers_torch_version_build_and_graph() -> None:
    base = ["2.13.0", "build-a", "graph-1"]
    assert cache.cache_key(base) == cache.cache_key(list(base))
    assert cache.cache_key(base) != cache.cache_key(["2.14.0", "build-a", "graph-1"])
    assert cache.cache_key(base) != cache.cache_key(["2.13.0", "build-b", "graph-1"])
    assert cache.cache_key(base) != cache.cache_key(["2.13.0", "build-a", "graph-2"])


def test_key_covers_every_module_of_the_runtime_and_the_jit() -> None:
    """A changed pass, code generator or Triton kernel writer misses: the fingerprint reads them all
    (it once read only the folder the cache module lives in)."""
    import opgen.jit.expr
    import opgen.runtime.codegen.python
    import opgen.runtime.passes.mkl_linear

    files = set(cache.fingerprinted_files())
    for module in (opgen.runtime.passes.mkl_linear, opgen.runtime.codegen.python, opgen.jit.expr, cache):
        assert Path(module.__file__).resolve() in files, module.__name__


def test_cache_dir_default_and_override(monkeypatch) -> None:
    monkeypatch.delenv("OPGEN_CACHE_DIR")
    assert cache.cache_dir() == Path.home() / ".cache" / "opgen"
    monkeypatch.setenv("OPGEN_CACHE_DIR", "/somewhere/else")
    assert cache.cache_dir() == Path("/somewhere/else")


def test_unreadable_or_foreign_entries_are_misses(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    key = "ab" * 32
    assert cache.load(key) is None
    (tmp_path / key[:2] / key).mkdir(parents=True)
    (tmp_path / key[:2] / key / "graph.json").write_text(json.dumps({"format": 999}))
    assert cache.load(key) is None


def test_a_machine_with_other_device_facts_compiles_its_own_program(tmp_path: Path, monkeypatch) -> None:
    """Passes decide by what ATen's kernels do on this GPU (`registry.facts`): another GPU's program is a miss."""
    from dataclasses import replace

    import torch

    import opgen
    from opgen.bench.models import ReshapeAdd
    from opgen.runtime import pipeline
    from opgen.runtime.registry import DeviceFacts

    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    x, y = torch.randn(16), torch.randn(16)

    def key() -> tuple[str, bool]:
        graph = opgen.compile(ReshapeAdd(), (x, y)).artifact  # type: ignore[attr-defined]
        return graph.key, graph.from_cache

    first, again = key(), key()
    assert again == (first[0], True)
    registry = replace(pipeline.default_registry(), facts=DeviceFacts((("bfloat16", True),)))
    monkeypatch.setattr(pipeline, "default_registry", lambda: registry)
    other = key()
    assert other[0] != first[0] and other[1] is False


def test_device_facts_print_the_same_in_every_process() -> None:
    """The facts join the cache key through their repr: a set's order follows string hashing, which
    changes per process, so on a GPU machine no process found another's entries. Only ordered data."""
    import dataclasses

    from opgen.runtime.registry import DeviceFacts

    for field in dataclasses.fields(DeviceFacts):
        assert not any(kind in str(field.type) for kind in ("set", "dict")), field
