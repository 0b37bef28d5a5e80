"""Leak checks in child processes (`leak_check.py`): memory flat and reference counts unchanged.

CI: 100,000 calls of representative kernel_ops functions, 100,000 calls of a compiled graph, 40
compiles and frees. `make fuzz` (OPGEN_LEAK_CALLS, OPGEN_LEAK_COMPILES): a million calls each and
1,000 compiles.
"""

from __future__ import annotations

import pytest
from children import budget, run_child


@pytest.mark.parametrize(
    ("what", "variable", "default"),
    [
        ("calls", "OPGEN_LEAK_CALLS", 100_000),
        ("graph", "OPGEN_LEAK_CALLS", 100_000),
        ("compiles", "OPGEN_LEAK_COMPILES", 40),
    ],
)
def test_no_leak(what: str, variable: str, default: int) -> None:
    count = budget(variable, default)
    result = run_child(
        "leak_check.py", what, f"--count={count}", timeout=120 + count * (1.0 if what == "compiles" else 0.0005)
    )
    print(f"leaks, {what}: {result.summary}")
    verdict = result.verdict()
    assert verdict is None, verdict
