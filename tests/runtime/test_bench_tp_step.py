"""`python -m opgen.bench tp_step` on the CPU: the tiny Llama's rank 0 of 2 gloo ranks, kernel by kernel.

No timed assertions: the rows are the rank's kernel calls (on the CPU, opgen's ops), its collectives
among them, with launches counted per step.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from opgen.bench import tp_step

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def test_rank_0s_step_is_profiled_with_its_collectives(capsys: pytest.CaptureFixture[str]) -> None:
    assert tp_step.main(["--tiny", "--tp", "2", "--calls", "2", "--repeats", "1", "--rows", "40"]) == 0
    out = capsys.readouterr().out
    assert "gpt-fast Llama, rank 0 of 2 (tiny widths), batch 1, float32 on cpu: a step takes" in out
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| kernel")}  # fmt: skip
    layers = 2  # the tiny shape's
    assert float(rows["_c10d_functional.all_reduce.default"]) == 2 * layers  # after attention and after the MLP
    assert float(rows["_c10d_functional.all_gather_into_tensor.default"]) == 1  # the logits
    assert float(rows["aten.mm.default"]) > 0


@pytest.mark.parametrize("argv", [["--tp", "0"], ["--calls", "0"], ["--tiny", "--tp", "2", "--context", "0"]])
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        tp_step.main(argv)
    assert done.value.code == 2
    assert "take positive numbers" in capsys.readouterr().err
