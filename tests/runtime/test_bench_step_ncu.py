"""`python -m opgen.bench step_ncu`: a decode step's kernels under Nsight Compute. On the CPU: the parsing of
ncu's output (`ncu_llama_b8.csv`, a real profile's kernels 3-11: Llama-3.2-1B's widths at batch 8 on an H200,
two layers), the table, and the errors; on a GPU with ncu, the whole command on one layer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from opgen.bench import step_ncu
from opgen.bench.__main__ import main as bench_main

PROFILE = (Path(__file__).parent / "ncu_llama_b8.csv").read_text()


def test_the_profile_is_read_kernel_by_kernel_in_the_steps_order() -> None:
    kernels = step_ncu.parse(PROFILE)
    names = [k.name for k in kernels]
    assert len(kernels) == 9 and names[0] == "fused_0f3aa17e81f9" and names[1] == "gemm_rows_5e3c73bb9c22"
    assert names[2].startswith("attention_grouped_") and names[6].startswith("nvjet_sm90_")
    assert names[7].startswith("void cublasLt::splitKreduce_kernel")  # a name holding commas and brackets
    qkv = kernels[1]
    assert qkv.what == "few-row kernel, 3 product(s) of 8 rows of 2048: 2048 + 512 + 512 rows"
    assert (qkv.programs, qkv.threads, qkv.registers, qkv.shared) == (96, 128, 48, 73728)
    assert qkv.us == pytest.approx(9.92) and qkv.dram_read == 12647680
    assert qkv.dram_pct == pytest.approx(26.56) and qkv.warps_pct == pytest.approx(6.23)
    assert kernels[6].what == "" and kernels[6].programs == 4 * 24 and kernels[6].threads == 384  # cuBLAS's
    assert kernels[5].programs == 256 and kernels[5].dram_read == 67152896  # the gate/up kernel


def test_the_table_gives_each_kernels_rate() -> None:
    text = step_ncu.report(step_ncu.parse(PROFILE), "llama, batch 8")
    assert text.splitlines()[0] == "llama, batch 8"
    headers = [c.strip() for c in text.splitlines()[1].strip("|").split("|")]
    assert headers[2:] == ["programs", "threads", "regs", "shared KB", "us alone", "DRAM read MB", "GB/s",
                           "% DRAM peak", "% warps active"]  # fmt: skip
    qkv = next(line for line in text.splitlines() if "gemm_rows_5e3c73bb9c22" in line)
    cells = [c.strip() for c in qkv.strip("|").split("|")]
    assert cells[2:] == ["96", "128", "48", "72", "9.92", "12.65", "1275", "26.6", "6.2"]


def test_output_without_a_profile_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"ncu printed no profile (.|\n)*==ERROR== no kernels were profiled"):
        step_ncu.parse("==PROF== Connected\n==ERROR== no kernels were profiled\n")
    header = PROFILE[PROFILE.index('"ID"') :].splitlines()[0]
    with pytest.raises(RuntimeError, match="held none of the metrics"):
        step_ncu.parse(header + "\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU is visible")
def test_no_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        bench_main(["step_ncu"])
    assert done.value.code == 2 and "needs a GPU: no CUDA device is visible" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "0"], "--batch and --layers take positive numbers"),
        (["--position", "9", "--cache", "8"], "--position 9 is outside a cache of 8 positions"),
        (["--ncu", "/nonexistent/ncu"], "Nsight Compute's ncu not found: --ncu /nonexistent/ncu is not an executable"),
    ],
)
def test_bad_arguments_are_clear_errors(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as done:
        bench_main(["step_ncu", *argv])
    assert done.value.code == 2 and message in capsys.readouterr().err


def _fake_ncu(monkeypatch: pytest.MonkeyPatch, returncode: int, stdout: str) -> list[list[str]]:
    """ncu as a shell printing `stdout` and exiting with `returncode`; the commands it was given."""
    commands: list[list[str]] = []
    real_run = step_ncu.run_ncu

    def run(command: list[str], timeout: float) -> tuple[int, str]:
        commands.append(command)
        script = f"import sys; sys.stdout.write({stdout!r}); sys.exit({returncode})"
        return real_run([sys.executable, "-c", script], timeout)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.setattr(step_ncu, "find_ncu", lambda given: "/opt/ncu")
    monkeypatch.setattr(step_ncu, "run_ncu", run)
    return commands


def test_the_command_runs_its_child_under_ncu_and_prints_the_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = _fake_ncu(monkeypatch, 0, PROFILE)
    assert bench_main(["step_ncu", "--batch", "8", "--family", "qwen2"]) == 0
    out, err = capsys.readouterr()
    (command,) = commands
    assert command[0] == "/opt/ncu" and command[command.index("--print-units") + 1] == "base"
    assert command[command.index("--profile-from-start") + 1] == "off"
    child = command[command.index("-m") - 1 :]
    assert child[1:5] == ["-m", "opgen.bench", "step_ncu", "--child"]
    assert child[child.index("--family") + 1] == "qwen2" and child[child.index("--batch") + 1] == "8"
    assert "under /opt/ncu" in err and "==PROF== Connected to process" in err  # ncu's lines, as progress
    assert out.startswith("qwen2, batch 8, 2 layers, bfloat16 on NVIDIA H200: 9 kernels, ")
    assert "gemm_rows_bb7754659636" in out


def test_a_failing_ncu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    denied = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    _fake_ncu(monkeypatch, 1, "==PROF== Connected\n" + denied + "\n")
    with pytest.raises(RuntimeError, match=r"ncu exited with status 1:\n(.|\n)*ERR_NVGPUCTRPERM"):
        bench_main(["step_ncu"])


def test_help_names_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        bench_main(["step_ncu", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    for option in ("--family", "--batch", "--layers", "--cache", "--position", "--ncu", "--timeout"):
        assert option in out
    assert "--child" not in out  # the child's flag is the command's own


@pytest.mark.skipif(not torch.cuda.is_available() or step_ncu.find_ncu(None) is None, reason="needs a GPU and ncu")
def test_one_layer_under_ncu_on_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["step_ncu", "--layers", "1", "--cache", "32", "--position", "8"]) == 0
    out = capsys.readouterr().out
    kernels = [line for line in out.splitlines() if line.startswith("| ") and "| kernel " not in line]
    assert any("gemv_" in line for line in kernels), out  # the products' generated kernels, described
    assert any("matrix-vector kernel" in line for line in kernels), out


def test_an_ncu_past_its_timeout_is_stopped_and_said() -> None:
    with pytest.raises(RuntimeError, match=r"ncu did not finish within 1 s \(--timeout\)"):
        sleeper = "import time; print('==PROF== Connected', flush=True); time.sleep(60)"  # ncu's child, as ncu runs it
        step_ncu.run_ncu(
            [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper!r}])"], 1
        )
