"""Every `python -m opgen.bench` command's --help exits 0 and names every option the command takes.

An option is any `"--name"` string literal in the command's module (where its parser and any
pre-parsing live), so an option read outside the parser, as `graphs --device` once was, fails here.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from opgen.bench.__main__ import COMMANDS
from opgen.bench.__main__ import main as bench_main
from opgen.cli import SIGPIPE_STATUS

CHECKED = ("ops", "graphs", "backend_cost", "jit", "dynamic", "gpu_work", "gpu_models", "zoo", "step", "chain",
           "tp_step")  # fmt: skip


def options_of(module_name: str) -> set[str]:
    module = importlib.import_module(module_name)
    return set(re.findall(r"\"(--[a-z][a-z0-9-]*)\"", Path(str(module.__file__)).read_text()))


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        bench_main(argv)
    assert done.value.code == 0, argv
    return capsys.readouterr().out


@pytest.mark.parametrize("command", CHECKED)
def test_help_exits_0_and_names_every_option(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    options = options_of(COMMANDS[command][0])
    assert "--repeats" in options, options  # every command takes it: the literals were found
    text = help_text([command, "--help"], capsys)
    assert text.startswith(f"usage: python -m opgen.bench {command}")
    assert not sorted(o for o in options if o not in text), text


def test_graphs_help_names_the_cuda_benchmark_and_that_one_its_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--device {cpu,cuda}" in help_text(["graphs", "--help"], capsys)
    text = help_text(["graphs", "--device", "cuda", "--help"], capsys)
    assert text.startswith("usage: python -m opgen.bench graphs --device cuda")
    assert not sorted(o for o in options_of("opgen.bench.graphs_cuda") if o not in text), text


def test_graphs_refuses_an_unknown_device(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        bench_main(["graphs", "--device=gpu"])
    assert done.value.code == 2
    assert "invalid choice: 'gpu' (choose from 'cpu', 'cuda')" in capsys.readouterr().err


def test_backend_cost_breaks_a_call_down(capsys: pytest.CaptureFixture[str]) -> None:
    """The parts come from one case's callables, timed once each: every column is filled in."""
    assert bench_main(["backend_cost", "--cases", "single_add", "--repeats", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| single_add"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == 9 and all(float(cell) > 0 for cell in cells[1:6]), row


@pytest.mark.parametrize("argv", [[], ["plan", "--family", "llama", "--size", "tiny"]], ids=["usage", "plan"])
def test_a_reader_gone_ends_the_command_quietly(
    argv: list[str], reader_gone: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """`python -m opgen.bench ... | head -1`: output to a pipe whose reader has closed it ends the command with
    SIGPIPE's status and no traceback (before, `BrokenPipeError` and a second one at exit)."""
    done = reader_gone("opgen.bench", *argv)
    assert done.returncode == SIGPIPE_STATUS and "Error" not in done.stderr, done.stderr
