"""`python -m opgen.bench tp` on the CPU: the tiny Llama split over 2 gloo ranks against the whole model.

No timed assertions (numbers go in the table): the sharding (`tp_models`), the lockstep timing and the
check against the whole model's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from opgen.bench import decode_models as dm
from opgen.bench import tp
from opgen.bench.tp_models import shard

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def test_the_command_runs_each_size_and_every_candidate_matches_the_whole_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tp.json"
    argv = ["--tiny", "--device", "cpu", "--tp", "1,2", "--steps", "2", "--repeats", "1", "--json", str(out)]
    assert tp.main(argv) == 0
    assert "== all sizes" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert {(r["tp"], r["candidate"]) for r in rows} == {(n, c) for n in (1, 2) for c in ("eager", "inductor", "opgen")}
    for row in rows:
        assert row["ok"] and row["tokens"] == "4/4" and row["us"] > 0 and row["back_to_back"] > 0, row
        assert row["note"] == "", row
        assert row["error"] < 1e-5, row  # float32: the split sums in another order, nothing more


def test_a_shard_holds_its_heads_its_part_of_the_mlp_and_of_the_vocabulary() -> None:
    class Group:  # shard() only stores the group for the collectives' names
        group_name = "0"

    shape = dm.SHAPES["tiny"]
    whole = dm.gpt_fast(shape, 16, torch.device("cpu"))
    parts = [shard(dm.gpt_fast(shape, 16, torch.device("cpu")), rank, 2, Group()) for rank in (0, 1)]
    layer, halves = whole.layers[0], [p.layers[0] for p in parts]
    assert [h.attention.heads for h in halves] == [shape.heads // 2] * 2
    assert [h.attention.kv_cache.k_cache.size(1) for h in halves] == [shape.kv_heads // 2] * 2
    up = torch.cat([h.feed_forward.w1.weight for h in halves])
    assert torch.equal(up, layer.feed_forward.w1.weight)
    down = torch.cat([h.feed_forward.w2.weight for h in halves], dim=1)
    assert torch.equal(down, layer.feed_forward.w2.weight)
    assert torch.equal(torch.cat([p.output.weight for p in parts]), whole.output.weight)
    with pytest.raises(ValueError, match=r"attention heads \(4\) does not split over 3 ranks"):
        shard(dm.gpt_fast(shape, 16, torch.device("cpu")), 0, 3, Group())
