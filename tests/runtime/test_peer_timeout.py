"""How long opgen's kernels over peer memory (`peer_sum`, `peer_gather`) wait for a peer: `OPGEN_PEER_TIMEOUT_S`
(`execution.peer_memory.wait_limit_ns`), the clock in their wait (`execution.epoch_words.arrived`), and on two
GPUs a rank whose peer never calls: its kernel stops, and the process's next CUDA call raises, instead of
spinning for ever."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import started
from test_one_shot_all_reduce import SPEC, _FakeGroup
from test_peer_gather import _FakeGroup as _GatheringGroup

from opgen.runtime.execution.peer_memory import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, wait_limit_ns
from opgen.runtime.ir import Collective


@pytest.mark.parametrize(("setting", "ns"), [(None, int(DEFAULT_TIMEOUT_S * 1e9)), ("", int(DEFAULT_TIMEOUT_S * 1e9)),
                                             ("2.5", 2_500_000_000), (" 30 ", 30_000_000_000), ("0", 0)])  # fmt: skip
def test_the_setting_is_seconds_and_zero_waits_for_ever(monkeypatch: pytest.MonkeyPatch, setting: str | None,
                                                        ns: int) -> None:  # fmt: skip
    if setting is None:
        monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(TIMEOUT_ENV, setting)
    assert wait_limit_ns() == ns


@pytest.mark.parametrize("setting", ["ten", "-1", "inf", "nan", "1e12"])
def test_a_setting_that_is_no_seconds_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, setting)
    with pytest.raises(ValueError, match=rf"{TIMEOUT_ENV}='{setting}': give the seconds"):
        wait_limit_ns()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("kind", ["peer_sum", "peer_gather"])
def test_binding_with_a_bad_setting_raises_rather_than_falling_back(monkeypatch: pytest.MonkeyPatch,
                                                                    kind: str) -> None:  # fmt: skip
    """The error comes before any collective call (so every rank fails alike), not as a fallback's warning."""
    from opgen.runtime.execution.collectives import issuer

    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    spec = Collective(SPEC.local, kind, "0", 2, "sum", node="n", dtype="bfloat16", numel=2048)
    with pytest.raises(ValueError, match=TIMEOUT_ENV):
        issuer(spec, _FakeGroup() if kind == "peer_sum" else _GatheringGroup())


def _ptx(kind: str, timeout_ns: int) -> str:
    """The kernel compiled for an H100/H200 (sm_90) without a GPU: Triton's compiler alone."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from opgen.runtime.execution.epoch_words import EPOCHS

    names = ["NUMEL", "RANK", "WORLD", "SLOT", "EPOCHS", "BLOCK", "BITS", "DEPENDENT", "TIMEOUT_NS"]
    values = [2048, 0, 2, 2048, EPOCHS, 1024, 16, True, timeout_ns]
    pointers = {"x": "*bf16", "buffers": "*i64", "counters": "*i32"}
    if kind == "peer_sum":
        from opgen.runtime.execution.peer_sum_kernel import peer_sum_kernel as kernel
    else:
        from opgen.runtime.execution.peer_gather_kernel import peer_gather_kernel as kernel

        pointers = {"x": "*bf16", "out": "*bf16", "buffers": "*i64", "counters": "*i32"}
        names[6], values[5:7] = "PACK", [2048, 2]
    constants = dict(zip(names, values, strict=True))
    signature = {**pointers, **dict.fromkeys(constants, "constexpr")}
    return compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32)).asm["ptx"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("kind", ["peer_sum", "peer_gather"])
def test_the_wait_reads_the_clock_only_where_it_is_bounded(kind: str) -> None:
    """With a bound the wait reads the GPU's clock and, past it, traps; with 0 it is the plain spin, unchanged
    (and Triton's interpreter, which has no clock, runs it)."""
    bounded, unbounded = _ptx(kind, 5_000_000_000), _ptx(kind, 0)
    assert "%globaltimer" in bounded and "trap;" in bounded
    assert "%globaltimer" not in unbounded and "trap;" not in unbounded


# --- two GPUs: rank 0 calls, its peer never does --------------------------------------------------------

WORLD = 2


@pytest.fixture
def ranks(tmp_path: Any) -> Iterator[Any]:
    """Ranks of their own for each test: the case leaves rank 0's CUDA context unusable."""
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):  # this workplace keeps multicast off
        os.environ.setdefault(key, "0" if key.startswith("NCCL") else "1")
    yield from started(WORLD, str(tmp_path), "nccl", "nccl_cases")


@pytest.mark.skipif(
    not (dist.is_available() and dist.is_nccl_available() and torch.cuda.device_count() >= WORLD),
    reason=f"needs {WORLD} GPUs and NCCL",
)
@pytest.mark.parametrize("kind", ["peer_sum", "peer_gather"])
def test_a_rank_whose_peer_never_calls_stops_instead_of_waiting_for_ever(ranks: Any, kind: str) -> None:
    waiting, _ = ranks.run(f"a_peer_never_calls_{kind}", 120)
    assert waiting["error"] is not None and "CUDA error" in waiting["error"], waiting
    assert 1.0 <= waiting["seconds"] < 30, waiting  # the 1-second bound, not for ever
