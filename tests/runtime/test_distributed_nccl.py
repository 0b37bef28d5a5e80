"""Tensor-parallel graphs on NCCL, one GPU per rank: the one-shot all-reduces, opgen's all-gather and NCCL's,
each forced once; opgen's all-gather kernel called alone against NCCL's.

Runs where this machine has two GPUs and NCCL (the GPU machine's multi-GPU kinds), skips elsewhere;
the gloo tests (`test_distributed.py`) cover the same lowering on the CPU. Cases: `nccl_cases.py`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import started

WORLD = 2
TIMEOUT = 240  # a case compiles twice (plain and CUDA-graph mode) in each rank

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_nccl_available() and torch.cuda.device_count() >= WORLD),
    reason=f"needs {WORLD} GPUs and NCCL",
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):  # this workplace keeps multicast off
        os.environ.setdefault(key, "0" if key.startswith("NCCL") else "1")
    yield from started(WORLD, str(tmp_path_factory.mktemp("opgen-cache-nccl")), "nccl", "nccl_cases")


ROUTES = ["peer_sum", "one_shot", "nccl"]  # opgen's kernels, torch's one-shot, NCCL (`nccl_cases._passes`)


@pytest.mark.parametrize("route", ROUTES)
def test_tensor_parallel_block_matches_the_whole_model(ranks: Any, route: str) -> None:
    for result in ranks.run(f"tp_block_{route}", TIMEOUT):
        assert all(e <= 1e-4 for e in result["errors"].values()), result
        one_shot = 0 if route == "nccl" else 2
        expected = {"one_shot": one_shot, "process group": 0, "peer_sum records": int(route == "peer_sum"),
                    "peer_gather records": 0}  # fmt: skip
        assert result["routes"] == expected, result


@pytest.mark.parametrize("route", ROUTES)
def test_tensor_parallel_decoder_matches_the_whole_model(ranks: Any, route: str) -> None:
    for result in ranks.run(f"tp_decoder_{route}", TIMEOUT):
        assert all(e <= 1e-4 for e in result["errors"].values()), result
        assert result["tokens"] == result["expected tokens"], result
        layers = 2  # two all-reduces a layer, on the one-shot path where chosen
        assert result["routes"]["one_shot"] == (0 if route == "nccl" else 2 * layers), result
        assert result["routes"]["peer_sum records"] == int(route == "peer_sum"), result
        assert result["routes"]["peer_gather records"] == int(route == "peer_sum"), result  # the logits' all-gather


def test_opgens_all_gather_kernel_matches_nccls_bit_for_bit_eager_and_replayed(ranks: Any) -> None:
    for result in ranks.run("peer_gather_calls", TIMEOUT):
        assert result == {"mismatches": [], "warnings": []}, result
