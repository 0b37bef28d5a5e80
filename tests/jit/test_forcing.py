"""Picks forced from the environment (`opgen.jit.forcing`): a candidate for every choice, one for a named
kernel, a config for a named JIT kernel; bad entries are clear errors."""

from __future__ import annotations

import re

import pytest
import torch

from opgen.jit.cache import STATS
from opgen.jit.choice import Choice
from opgen.jit.forcing import forced_candidate, forced_config


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OPGEN_FORCE_KERNEL", raising=False)
    monkeypatch.delenv("OPGEN_FORCE_CONFIG", raising=False)
    STATS.reset()


def test_nothing_set_forces_nothing() -> None:
    assert forced_candidate(("gemm_rows_1",), ("triton", "aten")) is None
    assert forced_config("gemm_rows_1", 4) is None


def test_a_bare_candidate_forces_the_choices_that_have_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    assert forced_candidate(("fused_1",), ("triton", "aten")) == "triton"
    assert forced_candidate(("node 'mm'",), ("mm_out", "mm")) is None  # another choice's candidate


def test_a_named_kernel_wins_over_a_bare_entry_and_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", " triton , gemm_rows_c39e=aten,")
    assert forced_candidate(("gemm_rows_c39e", "fused_7"), ("triton", "aten")) == "aten"
    assert forced_candidate(("gemm_rows_17db", "fused_3"), ("triton", "aten")) == "triton"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("k=cublas", "OPGEN_FORCE_KERNEL: k=cublas: 'cublas' is not a candidate (triton, aten)"),
        ("k=", "OPGEN_FORCE_KERNEL: entry 'k=' is not <kernel>=<value>"),
        ("=aten", "OPGEN_FORCE_KERNEL: entry '=aten' is not <kernel>=<value>"),
    ],
)
def test_bad_kernel_entries_are_clear_errors(monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", value)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        forced_candidate(("k",), ("triton", "aten"))


def test_a_config_is_forced_by_the_kernels_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_FORCE_CONFIG", "gemm_rows_c39e=3, attention_grouped_698e=0")
    assert forced_config("gemm_rows_c39e", 4) == 3
    assert forced_config("attention_grouped_698e", 2) == 0
    assert forced_config("gemm_rows_17db", 4) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gemm_rows_c39e=4", "OPGEN_FORCE_CONFIG: gemm_rows_c39e=4: gemm_rows_c39e has configs 0 to 3"),
        ("gemm_rows_c39e=-1", "OPGEN_FORCE_CONFIG: gemm_rows_c39e=-1: gemm_rows_c39e has configs 0 to 3"),
        ("gemm_rows_c39e=first", "OPGEN_FORCE_CONFIG: gemm_rows_c39e=first: gemm_rows_c39e has configs 0 to 3"),
        ("3", "OPGEN_FORCE_CONFIG: entry '3' is not <kernel>=<index>"),
    ],
)
def test_bad_config_entries_are_clear_errors(monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    monkeypatch.setenv("OPGEN_FORCE_CONFIG", value)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        forced_config("gemm_rows_c39e", 4)


def test_a_choice_named_in_the_variable_runs_its_forced_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The named choice runs the forced candidate without timing; a choice the entry does not name is left
    to its first call's timing, as without the variable."""
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "gemm_rows_c39e=b")
    calls: list[str] = []

    def candidate(name: str):  # type: ignore[no-untyped-def]
        return lambda x: calls.append(name) or x + 1

    named = Choice("fused_7 (few-row kernel)", {"a": candidate("a"), "b": candidate("b")}, names=("gemm_rows_c39e",))
    assert named(torch.ones(2)).tolist() == [2.0, 2.0]
    assert calls == ["b"] and "b (forced)" in named.describe() and STATS.choices == 0
    other = Choice("fused_3 (few-row kernel)", {"a": candidate("a"), "b": candidate("b")}, names=("gemm_rows_17db",))
    assert other.force is None
