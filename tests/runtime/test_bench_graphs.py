"""`python -m opgen.bench graphs` plumbing (no timed assertions: the numbers belong in the table)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from opgen.bench import graphs


def test_graphs_writes_a_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "graphs.json"
    argv = ["--cases", "single_add", "reshape_add", "--candidates", "opgen", "--repeats", "1", "--json", str(out)]
    assert graphs.main(argv) == 0
    text = capsys.readouterr().out
    assert "| single_add" in text and "opgen.compile" in text and "targets:" in text
    rows = json.loads(out.read_text())["results"]
    assert {(r["case"], r["candidate"]) for r in rows} == {
        ("single_add", "eager"), ("single_add", "opgen"), ("reshape_add", "eager"), ("reshape_add", "opgen"),
    }  # fmt: skip
    assert all(r["max_abs_err"] == 0.0 and r["ratio"] > 0 for r in rows)


def test_png_without_matplotlib_is_a_message_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = graphs.Result("single_add", "opgen", 1.0, 1.0, 1.0, 0.8, 0.1, 0.01, 0.0)
    message = graphs.save_png([result], ["opgen"], tmp_path / "chart.png")
    assert "matplotlib is not installed" in message and not (tmp_path / "chart.png").exists()
