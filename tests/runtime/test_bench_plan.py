"""`python -m opgen.bench plan`: a decode step's CUDA kernels planned on the CPU, nothing run. The counts are
`docs/jit-and-fusion.md`'s table of a layer's launches family by family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opgen.bench import plan as plan_module
from opgen.bench.__main__ import main as bench_main

pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("family", "batch", "per_layer"),
    [("llama", 1, 5), ("mistral", 1, 5), ("gemma", 1, 5), ("gemma2", 1, 5), ("qwen3", 1, 6), ("gpt2", 3, 7)],
)
def test_a_layers_launches_are_the_documented_ones(family: str, batch: int, per_layer: int) -> None:
    p = plan_module.plan(family, "tiny", batch)
    assert p.per_layer == per_layer and p.own > 0
    assert len(p.launches) == 2 * per_layer + p.own  # the two-layer step's, in order
    generated = [launch for launch in p.launches if launch.what != "ATen"]
    assert any(launch.what.startswith("decode attention") for launch in generated)
    products = "matrix-vector kernel" if batch == 1 else "few-row kernel"
    assert any(launch.what.startswith(products) for launch in generated)
    aten = [launch.kernel for launch in p.launches if launch.what == "ATen"]  # the step's start, not a layer's
    assert aten == (["embedding", "add", "embedding"] if family == "gpt2" else ["embedding"])  # GPT-2's positions


def test_a_sliding_windows_mask_runs_in_a_generated_kernel() -> None:
    """Mistral's mask is two comparisons and their `&` (bitwise_and): fused, no ATen launch of its own."""
    kernels = [launch.kernel for launch in plan_module.plan("mistral", "tiny").launches]
    assert not {"gt", "le", "bitwise_and", "where"} & set(kernels)


def test_a_pass_left_out_shows_in_the_launches(capsys: pytest.CaptureFixture[str]) -> None:
    """Without `gemv_prologue` a layer's two norms are row kernels of their own again: 7 launches, not 5."""
    assert bench_main(["plan", "--family", "llama", "--size", "tiny", "--leave-out", "gemv_prologue"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "planned for CUDA on this machine, without gemv_prologue: 7 launches a layer" in header, header
    p = plan_module.plan("llama", "tiny", left_out=("gemv_prologue",))
    assert sum(launch.what.startswith("row kernel") for launch in p.launches) == 2 * 2 + 1  # the final norm too


def test_the_command_prints_and_writes_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert bench_main(["plan", "--family", "qwen2", "--size", "tiny", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0]
    assert header.startswith("qwen2 (tiny widths), batch 1, bfloat16, planned for CUDA on this machine: 5 launches")
    assert "| # " in text and "| embedding " in text and "| ATen " in text
    data = json.loads(out.read_text())
    assert data["family"] == "qwen2" and data["per_layer"] == 5 and len(data["launches"]) == 10 + data["own"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--batch", "0"], "takes a positive number"), (["--family", "nope"], "invalid choice: 'nope'"),
     (["--leave-out", "gemv", "nope"], "--leave-out: no pass named 'nope' (passes: pads, "),
     (["--leave-out", "kernel_choice", "memo"], "'kernel_choice' is not in the pipeline this command runs;")],
)  # fmt: skip
def test_bad_arguments_are_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        bench_main(["plan", *argv])
    assert done.value.code == 2
    assert message in capsys.readouterr().err
