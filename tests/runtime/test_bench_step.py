"""`python -m opgen.bench step`: one decode step, kernel by kernel (CPU: a tiny Llama; the GPU's table is
the profiler's, as in `gpu_work`), and the report naming each generated kernel's Triton function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fusion_interp import compile_fused
from torch import nn

from opgen.bench import step_profile
from opgen.bench.__main__ import main as bench_main


def test_a_tiny_llama_step_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "step.json"
    argv = ["step", "--batch", "2", "--cache", "16", "--position", "4", "--calls", "2", "--rows", "5"]
    assert bench_main([*argv, "--device", "cpu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    header, work = text.splitlines()[:2]
    assert header.startswith("llama (tiny widths), batch 2, float32 on cpu: a step takes ") and " us (" in header
    assert work.startswith("one step's kernel calls: ") and "a layer (2 layers)" in work
    assert "| kernel " in text and "| aten.mm.default " in text and "| (" in text  # 5 rows shown, the rest summed
    assert "| what " not in text  # the CPU's rows are ops
    data = json.loads(out.read_text())
    assert data["family"] == "llama" and data["batch"] == 2 and data["layers"] == 2 and data["step_us"] > 0
    rows = {r["kernel"]: r for r in data["rows"]}
    mm = rows["aten.mm.default"]  # q, k, v, o, gate, up, down a layer, and the head: the products run as mm
    assert mm["launches"] == pytest.approx(2 * 7 + 1) and mm["us"] > 0
    assert data["launches"] == pytest.approx(sum(r["launches"] for r in data["rows"]))
    assert [r["us"] for r in data["rows"]] == sorted((r["us"] for r in data["rows"]), reverse=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--position", "16", "--cache", "16"], "--position 16 is outside a cache of 16 positions"),
        (["--batch", "0"], "take positive numbers"),
        (["--family", "nope"], "invalid choice: 'nope'"),
        (["--leave-out", "nope"], "--leave-out: no pass named 'nope'"),
        (["--leave-out", "kernel_choice"], "--leave-out: 'kernel_choice' is not in the pipeline this command runs;"),
    ],
)
def test_bad_arguments_are_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        bench_main(["step", "--device", "cpu", *argv])
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_a_jit_pass_on_the_cpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Leaving out `gemv` from a step on the CPU, where it never acts, would compare two equal steps: the parser
    says why (on any machine)."""
    with pytest.raises(SystemExit) as done:
        bench_main(["step", "--device", "cpu", "--leave-out", "gemv", "memo"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "--leave-out: 'gemv' is not in the pipeline this command runs (opgen's JIT passes act on CUDA only" in err
    assert "it runs: pads, " in err and ", memo, " in err and "gemv" not in err.split("it runs:")[1]


def test_a_pass_left_out_is_not_compiled_and_the_header_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import opgen

    compiled = opgen.compile
    passes: list[tuple[str, ...]] = []

    def recording(*args: object, **kwargs: object) -> object:
        passes.append(tuple(kwargs["passes"]))  # type: ignore[arg-type]
        return compiled(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(opgen, "compile", recording)
    argv = ["step", "--device", "cpu", "--cache", "8", "--position", "2", "--calls", "1", "--repeats", "1"]
    assert bench_main([*argv, "--leave-out", "dead_code", "memo"]) == 0
    assert passes and not {"dead_code", "memo"} & set(passes[0]) and "memory" in passes[0]
    assert "float32 on cpu, without dead_code, memo: a step takes " in capsys.readouterr().out


class _Norm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2.0 + 1.0, dim=-1)


def test_the_report_names_each_generated_kernels_function_and_the_bench_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A profiler names a generated kernel's launches by its Triton function: the report gives it in
    parentheses after the kernel's local name, and `descriptions` maps it back to what the kernel is."""
    with torch.no_grad():
        compiled, _ = compile_fused(monkeypatch, _Norm(), (torch.randn(4, 16),), run_triton=False)
    lines = [line for line in compiled.report().jit if line.startswith("fused ")]  # type: ignore[attr-defined]
    assert len(lines) == 1, lines
    local, name = lines[0].split(" ")[1:3]
    assert local == "fused0" and name.startswith("(fused_") and name.endswith("):")
    found = step_profile.descriptions(lines)
    assert found == {name[1:-2]: "row kernel, 4 rows of 16 (4x16)"}
    assert step_profile.descriptions(["node 'k': mod.path:add_kernel, 2 config(s): not called yet"]) == {
        "add_kernel": "Triton kernel of node 'k'"
    }
