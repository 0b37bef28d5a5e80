"""`python -m opgen.bench chain`: a decoder's products as one persistent launch against a launch each. On
the CPU its kernels run in Triton's interpreter (one program); the co-residency rule that keeps the
persistent kernel from waiting forever is plain arithmetic, checked here with an H200's limits."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from opgen.bench.__main__ import main as bench_main
from opgen.bench.chain import CHECKED_LAYERS, WIDTHS, Tiles, _errors, make_chain, reference, resident_programs

needs_interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)
H200 = {"threads": 2048, "registers": 65536, "shared": 233472, "blocks": 32}


def chain_command(*argv: str) -> subprocess.CompletedProcess[str]:
    """In a child: Triton reads TRITON_INTERPRET when it is first imported, which this process may have done."""
    return subprocess.run([sys.executable, "-m", "opgen.bench", "chain", *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip


def errors(output: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[-1]) for line in output.splitlines() if " error " in line}


@needs_interpreter
def test_every_way_of_one_row_matches_torchs_chain_and_each_other() -> None:
    done = chain_command("--device", "cpu")
    assert done.returncode == 0, done.stderr[-3000:]
    header = done.stdout.splitlines()[0]
    assert header.startswith("chain of tiny widths, 2 layers, bf16, cpu (Triton's interpreter), 1 persistent")
    found = errors(done.stdout)
    assert set(found) == {"launches", "persistent"}
    assert found["launches"] == found["persistent"] < 0.15  # the same tiles; bf16 rounding of 8 products


@needs_interpreter
@pytest.mark.parametrize("rows", [3, 8])
def test_a_few_rows_on_the_fma_units_match_torchs_chain(rows: int) -> None:
    done = chain_command("--device", "cpu", "--rows", str(rows), "--tiles", "4,4,2,4,64,64,4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{rows} rows, tiles: rows 4/4/2/4, K blocks 64/64, 4 warps, 3 stages, FMA" in done.stdout
    found = errors(done.stdout)
    assert set(found) == {"launches"} and found["launches"] < 0.15


def test_the_reference_rounds_each_product_as_the_kernels_store() -> None:
    chain = make_chain("tiny", torch.device("cpu"), layers=1)
    x = torch.randn(2, chain.hidden).bfloat16()
    got = reference(chain, x)
    hidden, qkv, inter, _ = WIDTHS["tiny"]
    assert got.shape == (2, hidden) and chain.w_qkv.shape == (1, qkv, hidden) and chain.w_d.shape == (1, hidden, inter)
    assert torch.equal(got, got.bfloat16().float())  # every value a bf16 one
    assert chain.weight_bytes == 2 * (qkv * hidden + hidden * hidden + 3 * inter * hidden)


def test_the_check_covers_the_first_layers_where_the_values_are_not_yet_zero() -> None:
    """Products without norms between them square the values layer after layer: at real widths a 16-layer
    chain ends all zeros, where any result would match. The check runs the first CHECKED_LAYERS layers."""
    chain = make_chain("qwen", torch.device("cpu"), layers=CHECKED_LAYERS + 1)
    x = torch.randn(1, chain.hidden, generator=torch.Generator().manual_seed(1)).bfloat16()
    scales = [float(reference(replace(chain, layers=n), x).abs().max()) for n in range(1, CHECKED_LAYERS + 2)]
    assert scales[CHECKED_LAYERS - 1] > 1e-3 and scales == sorted(scales, reverse=True)
    with pytest.raises(RuntimeError, match="torch's chain is all zeros: nothing to check the kernels against"):
        _errors(chain, Tiles(), 1, torch.zeros_like(x))


@pytest.mark.parametrize(
    ("registers", "shared", "warps", "resident"),
    [
        (32, 0, 4, 16),  # threads: 2048 / 128
        (64, 0, 4, 8),  # registers: 65536 / (64 * 32 * 4)
        (40, 0, 4, 12),  # 40 registers take 1280 a warp (units of 256): 65536 / 5120
        (32, 100_000, 4, 2),  # shared memory
        (255, 0, 8, 1),
        (16, 0, 1, 32),  # the blocks an SM holds
    ],
)
def test_programs_an_sm_holds(registers: int, shared: int, warps: int, resident: int) -> None:
    assert resident_programs(registers, shared, warps, H200) == resident


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "cpu", "--widths", "1b"], "--device cpu runs Triton's interpreter: --widths tiny, not 1b"),
        (["--device", "cpu", "--tiles", "3,4,4,4,4,4,4"], "--tiles 3,4,4,4,4,4,4: seven powers of two"),
        (["--device", "cpu", "--tiles", "4,4"], "--tiles 4,4: seven powers of two"),
        (["--device", "cpu", "--dot", "--tiles", "4,4,2,4,64,64,4"], "tensor-core tiles take at least 16 rows"),
        (["--device", "cpu", "--dot", "--tiles", "16,16,16,16,64,64,4"], "--dot runs on CUDA only"),
        (["--device", "cpu", "--rows", "65"], "--rows 65: 1 to 64"),
        (["--device", "cpu", "--per-sm", "0"], "--per-sm, --repeats, --stages and --layers take a positive count"),
        (["--device", "cpu", "--layers", "0"], "--per-sm, --repeats, --stages and --layers take a positive count"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as done:
        bench_main(["chain", *argv])
    assert done.value.code == 2
    assert message in capsys.readouterr().err
