"""opgen's CUDA graphs coexist with whatever else the process does with CUDA memory.

Each test runs `coexistence_steps.py` in a process of its own (a graph replaying into freed memory
poisons the CUDA context, so a failure would take every later test of the process with it): opgen
graphs of cuBLAS, cuDNN and Triton models, then the steps, checking every graph against eager after
each. One test per step alone, and one with all of them in turn, in one process. Skipped without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = Path(__file__).with_name("coexistence_steps.py")
STEPS = ("clear_cublas", "empty_cache", "reduce_overhead_same", "reduce_overhead_other", "user_graph",
         "second_opgen", "destroy")  # fmt: skip
ALL = (*STEPS, "clear_cublas", "reduce_overhead_same", "empty_cache")  # then the disturbances again


def run_steps(steps: tuple[str, ...], tmp_path: Path) -> None:
    env = dict(os.environ, OPGEN_CACHE_DIR=str(tmp_path / "opgen"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run([sys.executable, str(SCRIPT), *steps], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert done.stdout.count("ok: ") == len(steps) + 1, done.stdout


@pytest.mark.parametrize("step", STEPS)
def test_graphs_survive(step: str, tmp_path: Path) -> None:
    run_steps((step,), tmp_path)


def test_graphs_survive_everything_in_turn(tmp_path: Path) -> None:
    run_steps(ALL, tmp_path)


def test_the_script_refuses_an_unknown_step() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "no_such_step"], capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 2 and "unknown steps ['no_such_step']" in done.stdout
