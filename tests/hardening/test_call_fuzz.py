"""Call fuzzing in child processes: no crash, no hang, clean errors, eager's results where eager succeeds.

The budget is OPGEN_FUZZ_CALLS_PER_FUNCTION examples per kernel_ops function (CI: 16, about 4,000
calls; `make fuzz`: 400, over 100,000). `call_fuzz.py` says what counts as a failure.
"""

from __future__ import annotations

import pytest
from children import budget, run_child

SHARDS = 2


@pytest.mark.parametrize("shard", range(SHARDS))
def test_call_fuzz(shard: int) -> None:
    per_function = budget("OPGEN_FUZZ_CALLS_PER_FUNCTION", 16)
    seed = budget("OPGEN_FUZZ_SEED", 0)
    result = run_child(
        "call_fuzz.py",
        f"--per-function={per_function}",
        f"--seed={seed}",
        f"--shard={shard}/{SHARDS}",
        timeout=60 + per_function * 10,
    )
    print(f"call fuzz, shard {shard}: {result.summary}")
    verdict = result.verdict()
    assert verdict is None, verdict
    assert result.counts()["calls"] >= per_function * 100 // SHARDS, result.summary
