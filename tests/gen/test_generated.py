"""The generator's output: deterministic, written only when changed, and committed in generated/."""

from __future__ import annotations

from pathlib import Path

from opgen.gen.emit import emit, output_names
from opgen.gen.writer import write_files
from opgen.spec.validate import load_spec

ROOT = Path(__file__).resolve().parents[2]
REFRESH = "python -m opgen gen --spec ops.yaml --out generated"


def test_snapshot_matches_ops_yaml() -> None:
    files = emit(load_spec(ROOT / "ops.yaml"), "ops.yaml")
    snapshot = {p.name: p.read_text() for p in (ROOT / "generated").iterdir() if p.name != "README.md"}
    assert sorted(snapshot) == sorted(files), f"generated/ holds other files; run `{REFRESH}`"
    stale = [name for name in files if files[name] != snapshot[name]]
    assert not stale, f"generated/ is stale ({', '.join(stale)}); run `{REFRESH}`"


def test_output_is_deterministic_and_machine_independent(tmp_path: Path) -> None:
    spec = tmp_path / "ops.yaml"
    spec.write_text((ROOT / "ops.yaml").read_text())
    first = emit(load_spec(spec), "ops.yaml")
    assert first == emit(load_spec(ROOT / "ops.yaml"), "ops.yaml")
    for name, text in first.items():
        assert str(tmp_path) not in text and str(ROOT) not in text, name
        assert "\r" not in text, name
    assert list(first) == output_names()


def test_writer_touches_only_changed_files(tmp_path: Path) -> None:
    files = {"a.cpp": "int a;\n", "b.cpp": "int b;\n"}
    assert write_files(tmp_path, files) == ["a.cpp", "b.cpp"]
    mtime = (tmp_path / "a.cpp").stat().st_mtime_ns
    assert write_files(tmp_path, files) == []
    assert write_files(tmp_path, {**files, "b.cpp": "int c;\n"}) == ["b.cpp"]
    assert (tmp_path / "a.cpp").stat().st_mtime_ns == mtime
    assert not list(tmp_path.glob("*.tmp"))


def test_shards_keep_op_groups_together() -> None:
    ops = load_spec(ROOT / "ops.yaml")
    files = emit(ops, "ops.yaml", shards=3)
    shard_of_add = [n for n, t in files.items() if "kernel_ops_add(" in t]
    assert shard_of_add == [n for n, t in files.items() if "kernel_ops_add_out(" in t]
    functions = sum(t.count("\n// ops.yaml:") for n, t in files.items() if n.startswith("kernel_ops_"))
    assert functions == len(ops)
