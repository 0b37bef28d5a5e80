"""`python -m opgen.bench generate` runs end to end on a tiny model: every row it is asked for has
figures (transformers' loop alone too), the loop's logits check and step time are filled in, and the
prefill never recompiled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opgen.bench import generate as bench

pytest.importorskip("transformers")


def test_a_tiny_run_fills_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gen.json"
    rows = ["eager", "hf_opgen_forward", "opgen_loop", "hf_floor"]
    assert bench.main(["--device", "cpu", "--prompts", "3", "9", "--batches", "2", "--new", "4", "--repeats", "1",
                       "--rows", *rows, "--json", str(out)]) == 0  # fmt: skip
    results = json.loads(out.read_text())["results"]
    assert [(r["row"], r["prompt"]) for r in results] == [(row, p) for p in (3, 9) for row in rows]
    for r in results:
        assert not r["error"], r
        assert r["decode_ms"] is not None and r["tokens_per_s"] > 0
        # float32: every path's greedy tokens are eager's; the forward that computes nothing has no tokens to compare
        assert r["equal_tokens"] == (None if r["row"] == "hf_floor" else 4)
    loop = [r for r in results if r["row"] == "opgen_loop"]
    assert all(r["logit_err"] < 1e-4 and r["step_ms"] > 0 for r in loop)
    # the backend row says how each graph it compiled ran (on the CPU: plainly); the others say nothing
    assert all(r["note"].startswith("graph 0: plain") for r in results if r["row"] == "hf_opgen_forward")
    assert all(not r["note"] for r in results if r["row"] != "hf_opgen_forward")
    assert "{2: 1} (1 = no recompile)" in capsys.readouterr().out


def test_a_graph_note_counts_replays_and_names_decode_attention() -> None:
    from opgen.bench import graph_notes

    class Compiled:
        def __init__(self, *lines: str) -> None:
            self.lines = lines

        def report(self) -> str:
            return "\n".join(["opgen report for GraphModule: 9 graph nodes", *self.lines])

    replayed = Compiled("  CUDA graph: captured on the first call (0.05 s), replayed since (1270 replays; 3 calls ran "
                        "plain: inputs unlike the capture's (sizes, strides, or another tensor for a fixed input))",
                        "  fused: decode attention, 32 heads of one query over 160 keys")  # fmt: skip
    plain = Compiled("  CUDA graph: not used, running the plain generated code: input arg8_1 is a CPU tensor")
    assert graph_notes.note([plain, replayed, Compiled()]) == (
        "graph 0: not used, running the plain generated code: input arg8_1 is a CPU tensor; "
        "graph 1: 1270 replays, 3 plain, decode attention; graph 2: plain"
    )
