"""`python -m opgen.bench graphs` plumbing (no timed assertions: the numbers belong in the table)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from opgen.bench import graphs


def test_graphs_writes_a_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "graphs.json"
    argv = ["--cases", "single_add", "reshape_add", "--candidates", "opgen", "--repeats", "1", "--threads", "1"]
    argv += ["--json", str(out)]
    assert graphs.main(argv) == 0
    text = capsys.readouterr().out
    assert "| single_add" in text and "opgen.compile" in text and "targets:" in text
    rows = json.loads(out.read_text())["results"]
    assert {(r["case"], r["candidate"]) for r in rows} == {
        ("single_add", "eager"), ("single_add", "opgen"), ("reshape_add", "eager"), ("reshape_add", "opgen"),
    }  # fmt: skip
    assert all(r["max_abs_err"] == 0.0 and r["ratio"] > 0 for r in rows)


def test_the_package_is_a_candidate_with_its_load_time(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--cases", "single_add", "--candidates", "opgen_package", "--repeats", "1", "--threads", "1"]
    assert graphs.main(argv) == 0
    text = capsys.readouterr().out
    assert "opgen package: load + first call" in text
    assert "| single_add | 1       | opgen.package + load_package" in text


def test_the_cpp_loop_runs_the_add_where_it_is_the_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hand-written C++ loop (built here with torch's extension builder) computes the add; it joins
    single_add and reshape_add, not gpt_block, and the target line compares the C++ backend with it."""
    import torch

    from opgen.bench import cpp_loop

    if (why := cpp_loop.missing()) is not None:
        pytest.skip(f"the C++ loop cannot be built here: {why}")
    x, y = torch.randn(16), torch.randn(16)
    assert torch.equal(cpp_loop.build("single_add", (x, y))(), x + y)
    with pytest.raises(ValueError, match="not one add"):
        cpp_loop.build("gpt_block", (x, y))
    out = tmp_path / "graphs.json"
    argv = ["--cases", "single_add", "gpt_block", "--candidates", "opgen_cpp", "cpp_loop", "--repeats", "1"]
    assert graphs.main([*argv, "--threads", "1", "--json", str(out)]) == 0
    rows = {(r["case"], r["candidate"]): r for r in json.loads(out.read_text())["results"]}
    assert ("single_add", "cpp_loop") in rows and ("gpt_block", "cpp_loop") not in rows
    assert rows["single_add", "cpp_loop"]["max_abs_err"] == 0.0
    assert "the hand-written C++ loop (target <= 1.1)" in capsys.readouterr().out


def test_png_without_matplotlib_is_a_message_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = graphs.Result("single_add", "opgen", 1.0, 1.0, 1.0, 0.8, 0.1, 0.01, 0.0)
    message = graphs.save_png([result], ["opgen"], tmp_path / "chart.png")
    assert "matplotlib is not installed" in message and not (tmp_path / "chart.png").exists()


def test_thread_counts_parse_and_every_table_keeps_them_apart() -> None:
    assert graphs.thread_counts("1,all,1")[0] == 1 and len(graphs.thread_counts("1,all,1")) <= 2
    assert graphs.thread_counts("2") == (2,)
    with pytest.raises(Exception, match="positive integers or 'all'"):
        graphs.thread_counts("0")
    results = [
        graphs.Result(case, cand, us, us, us, us / 10.0, 0.1, None, 0.0, threads)
        for threads, scale in ((1, 1.0), (4, 0.5))
        for case, cand, us in (
            ("gpt_block", "eager", 10.0 * scale),
            ("gpt_block", "inductor", 8.0 * scale),
            ("gpt_block", "aoti", 9.0 * scale),
            ("gpt_block", "opgen", 6.0 * scale if threads == 1 else 12.0 * scale),
        )
    ]
    summary = graphs.summary_table(results, ["eager", "inductor", "aoti", "opgen"])
    assert summary.count("| gpt_block") == 2
    lines = graphs.compiler_lines(results)
    assert "gpt_block, 1 thread(s): opgen.compile 0.750x the faster compiler" in lines[0] and lines[0].endswith(": met")
    assert "gpt_block, 4 thread(s): opgen.compile 1.500x" in lines[1] and lines[1].endswith("NOT met")


def test_dynamic_bench_prints_totals_and_the_steady_state_ratio_per_length(capsys: pytest.CaptureFixture[str]) -> None:
    from opgen.bench import dynamic

    argv = ["--lengths", "3", "--layers", "1", "--width", "32", "--candidates", "eager", "opgen_dynamic"]
    assert dynamic.main([*argv, "--repeats", "1"]) == 0
    text = capsys.readouterr().out
    assert "| opgen.compile(dynamic_shapes=1..256)" in text and "| dynamic / static | min / min |" in text
    assert all(f"length {n}: dynamic " in text for n in dynamic.STEADY_LENGTHS)


def test_a_cpp_loop_that_cannot_be_built_is_left_out_with_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from opgen.bench import cpp_loop

    monkeypatch.setattr(cpp_loop, "missing", lambda: "RuntimeError: Ninja is required to load C++ extensions")
    argv = ["--cases", "single_add", "--candidates", "cpp_loop", "--repeats", "1", "--threads", "1"]
    assert graphs.main(argv) == 0
    text = capsys.readouterr().out
    assert "C++ loop over the kernel calls skipped: it could not be built (RuntimeError: Ninja" in text
    assert "| single_add | 1       | eager" in text
