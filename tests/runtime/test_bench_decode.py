"""`python -m opgen.bench decode` plumbing on the CPU, tiny models (no timed assertions: numbers go in the table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opgen
from opgen.bench import decode, decode_families
from opgen.bench import decode_models as dm


def test_the_command_prints_its_table_and_opgen_matches_eager(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "decode.json"
    argv = ["--device", "cpu", "--tiny", "--steps", "3", "--repeats", "2", "--check", "4"]
    argv += ["--candidates", "opgen", "opgen_graphs", "--json", str(out)]
    assert decode.main(argv) == 0
    text = capsys.readouterr().out
    assert "| gpt_fast" in text and "| hf_llama" in text and "tokens == eager" in text
    rows = {(r["model"], r["candidate"]): r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {(m, c) for m in dm.FAMILIES for c in ("eager", "opgen", "opgen_graphs")}
    for model in dm.FAMILIES:
        eager = rows[model, "eager"]
        assert eager["argmax_equal"] == 4 and eager["max_logit_err"] == 0.0 and eager["ms_per_token"] > 0
        assert rows[model, "opgen_graphs"]["error"] == "skipped: CUDA-graph mode needs CUDA"
    ours = rows["gpt_fast", "opgen"]  # our own gpt-fast-style model compiles through opgen.compile
    assert ours["error"] == "" and ours["argmax_equal"] == 4 and ours["agrees"] and ours["ms_per_token"] > 0
    hf = rows["hf_llama", "opgen"]  # either it runs and agrees, or the row carries the error: never a crash
    assert hf["agrees"] if not hf["error"] else hf["ms_per_token"] is None
    # weights, plus the KV cache's 1024 bytes per position up to the timed steps' mean position + 1 (8..10: 10)
    assert rows["gpt_fast", "eager"]["bytes_per_token"] == dm.estimated_bytes(dm.SHAPES["tiny"]) + 1024 * 10


def test_generate_agrees_between_eager_and_a_compiled_step() -> None:
    model = dm.gpt_fast(dm.SHAPES["tiny"], 16, torch.device("cpu"))
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        eager = decode.generate(model, prompt, 6)
        for layer in model.layers:  # the compiled step must write the model's own cache
            layer.attention.kv_cache.k_cache.zero_()
        compiled = opgen.compile(model, (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)))
        free = decode.generate(compiled, prompt, 6)  # greedy on its own tokens
        forced = decode.generate(compiled, prompt, 6, forced=eager.tokens)
    assert len(eager.tokens) == len(eager.logits) == 6
    assert free.tokens == eager.tokens == forced.tokens
    assert max(float((a - b).abs().max()) for a, b in zip(forced.logits, eager.logits, strict=True)) < 1e-4
    assert int(model.layers[0].attention.kv_cache.k_cache[0, 0, 7].abs().sum()) != 0  # the compiled step wrote it


def test_a_failing_candidate_is_a_row_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    real = decode.make_step

    def broken(name: str, *args: object) -> decode.Step:
        if name == "opgen":
            raise AssertionError("expected compiled_fn to be GraphModule\nmore lines")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(decode, "make_step", broken)
    plan = decode.Plan(prompt=2, check=2, steps=2, repeats=1)
    with torch.no_grad():
        results = decode.run_model("gpt_fast", dm.SHAPES["tiny"], ["eager", "opgen"], plan, torch.device("cpu"), 1e10)
    assert [r.candidate for r in results] == ["eager", "opgen"]
    assert results[0].ms_per_token and results[0].error == ""
    assert results[1].error == "AssertionError: expected compiled_fn to be GraphModule"
    assert "AssertionError" in decode.results_table(results, cuda=False)


def test_sizes_and_bytes() -> None:
    assert abs(dm.estimated_bytes(dm.SHAPES["1b"]) - 2.47e9) < 0.01e9  # Llama-3.2-1B in bf16
    assert abs(dm.estimated_bytes(dm.SHAPES["8b"]) - 16.06e9) < 0.05e9  # Llama-3.1-8B in bf16
    tiny = dm.SHAPES["tiny"]
    model = dm.gpt_fast(tiny, 8, torch.device("cpu"))
    assert dm.weight_bytes(model) == dm.estimated_bytes(tiny)  # tied: the table is read once, by lm_head
    assert dm.kv_bytes_per_position(model) == tiny.layers * 2 * tiny.kv_heads * tiny.head_dim * 4
    untied = dm.Shape("untied", 64, 1, 4, 2, 128, 512, False, torch.float32)
    model = dm.gpt_fast(untied, 8, torch.device("cpu"))
    assert dm.weight_bytes(model) == dm.estimated_bytes(untied) - (512 - 1) * 64 * 4  # one embedding row


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        decode_families.main(["--help"])  # the command's entry (opgen.bench.__main__)
    text = capsys.readouterr().out
    for option in ("--device", "--sizes", "--tiny", "--models", "--candidates", "--steps", "--repeats", "--check",
                   "--prompt", "--threads", "--json", "--families", "--batches", "--size", "--dtype"):  # fmt: skip
        assert option in text


def test_families_at_several_batch_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--families`: transformers' families (tiny on the CPU) at each batch size, opgen against eager on row 0's
    logits, every row's cache in the bytes a step reads; kernels per layer are counted on CUDA only."""
    pytest.importorskip("transformers")
    from opgen.bench.llm_families import causal_lm, step

    out = tmp_path / "families.json"
    argv = ["--device", "cpu", "--families", "llama", "gpt2", "--batches", "1", "3", "--steps", "2", "--repeats", "1"]
    assert decode_families.main([*argv, "--check", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| llama  | tiny   | 3     | opgen.compile" in text and "kernels/layer" in text
    assert text.count("| gpt2   | tiny   | 1     | eager") == 2  # as the model's rows came, then in the whole table
    rows = {(r["model"], r["batch"], r["candidate"]): r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {(f, b, c) for f in ("llama", "gpt2") for b in (1, 3) for c in ("eager", "opgen")}
    for (family, batch, candidate), row in rows.items():
        assert row["error"] == "" and row["argmax_equal"] == 3 and row["agrees"] and row["ms_per_token"] > 0, row
        assert row["kernels_per_layer"] is None and row["layers"] == 2
    model = step(causal_lm("llama", "tiny"), 4 + 3 + 2)
    weights, kv = dm.weight_bytes(model), dm.kv_bytes_per_position(model)  # kv: one row of the batch
    assert rows["llama", 1, "eager"]["bytes_per_token"] == weights + kv * 8  # positions 7..8: mean + 1 = 8
    assert rows["llama", 3, "eager"]["bytes_per_token"] == weights + 3 * kv * 8  # weights once, each row's cache


def test_families_refuse_a_batch_below_one() -> None:
    with pytest.raises(SystemExit, match="--batches must be >= 1"):
        decode_families.main(["--device", "cpu", "--families", "llama", "--batches", "0"])


def test_a_compiled_candidate_is_held_to_reduce_overheads_error() -> None:
    """bf16 logits: a candidate's error within 1.5x reduce-overhead's on the same model is ok; past it, only the
    fixed tolerance counts; reduce-overhead's own row keeps the fixed tolerance."""
    from opgen.bench.decode import Result

    def row(candidate: str, err: float | None, agrees: bool | None) -> decode_families.Row:
        result = Result("phi3", "real", candidate, 1.0, 1.0, 1.0, 1.0, 1.0, 1, 0.5, 7, 8, err, agrees)
        return decode_families.Row(result, 1, 32, 14.5)

    rows = [row("eager", 0.0, True), row("compile", 0.20, False), row("opgen_graphs", 0.22, False)]
    judged = [r.result.agrees for r in decode_families.against_reduce_overhead(rows)]
    assert judged == [True, False, True]
    rows[2] = row("opgen_graphs", 0.31, False)  # past 1.5 x 0.20
    assert [r.result.agrees for r in decode_families.against_reduce_overhead(rows)] == [True, False, False]
    no_bar = [row("eager", 0.0, True), row("opgen_graphs", 0.22, False)]  # reduce-overhead did not run
    assert decode_families.against_reduce_overhead(no_bar) == no_bar
    failed = [row("eager", 0.0, True), row("compile", 0.2, False), row("opgen_graphs", None, None)]
    assert decode_families.against_reduce_overhead(failed)[2].result.agrees is None  # a failed row stays failed
