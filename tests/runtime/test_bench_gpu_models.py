"""`python -m opgen.bench gpu_models` plumbing on the CPU: the models build and run, the table and the
targets read the results right (the GPU run itself is the benchmark; no timed assertions here)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from opgen.bench import gpu_model_zoo as zoo
from opgen.bench import gpu_models
from opgen.bench.gpu_models import Result


def test_a_missing_library_is_a_reason_and_every_model_names_its_library() -> None:
    fake = zoo.GpuModel("x", "no_such_library_here", torch.float32, "x", zoo._bert)
    assert fake.missing() == "no_such_library_here is not installed"
    assert {m.library for m in zoo.MODELS} == {"torchvision", "timm", "transformers"}
    assert len(set(zoo.NAMES)) == len(zoo.MODELS)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (the zoo extra)")
def test_the_one_token_decoder_builds_and_runs_in_its_dtype() -> None:
    entry = next(m for m in zoo.MODELS if m.name == "qwen2_token")
    model, inputs = entry.build(torch.device("cpu"))
    assert next(model.parameters()).dtype == torch.bfloat16 and inputs[0].shape == (1, 1)
    with torch.no_grad():
        logits = model(*inputs)
    assert logits.shape == (1, 1, 32000) and torch.isfinite(logits).all()


def test_rel_error_is_scaled_by_the_reference() -> None:
    ref = torch.tensor([10.0, -20.0])
    assert gpu_models.rel_error((ref + torch.tensor([0.0, 0.2]),), (ref,)) == pytest.approx(0.01, rel=1e-5)
    assert gpu_models.rel_error(ref, ref) == 0.0


def test_table_and_targets_read_failures_and_ratios() -> None:
    results = [
        Result("bert", "eager", 1000.0, 900.0, 300, 0.1, 0.0),
        Result("bert", "inductor", 500.0, 400.0, 100, 20.0, 1e-3),
        Result("bert", "reduce_overhead", 100.0, 400.0, 100, 25.0, 1e-3),
        Result("bert", "opgen", 400.0, 420.0, 120, 8.0, 2e-3),
        Result("bert", "opgen_graphs", None, failed="OpgenError: no"),
    ]
    table = gpu_models.results_table(results)
    assert "| bert  | opgen plain " in table and "0.400" in table and "failed: OpgenError: no" in table
    lines = "\n".join(gpu_models.target_lines(results))
    assert "bert plain / Inductor default: 0.800 (target <= 1.000): met" in lines
    assert "bert first call / Inductor's cold compile: 0.400 (target <= 0.500): met" in lines
    assert "bert opgen plain rel err: 0.002 (target <= 0.010): met" in lines  # BERT runs in float16
    assert "bert: opgen cuda_graphs failed: NOT met" in lines
    assert "graph mode / reduce-overhead" not in lines  # nothing to compare with a failed candidate


def test_cold_caches_give_each_model_its_own_empty_folders(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in gpu_models.CACHE_VARIABLES:
        monkeypatch.setenv(variable, "unused")
    gpu_models.cold_caches(tmp_path, "bert")
    folders = {variable: os.environ[variable] for variable in gpu_models.CACHE_VARIABLES}
    assert len(set(folders.values())) == 3 and all(str(tmp_path / "bert") in f for f in folders.values())
