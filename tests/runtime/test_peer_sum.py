"""opgen's own one-shot all-reduce (`passes.peer_sum`, `execution.peer_sum`, `execution.peer_sum_kernel`).

The pass tests build programs by hand, as `test_one_shot_all_reduce.py` does. The kernel runs in Triton's
interpreter where triton is installed and no GPU is visible: three processes, one a rank, their buffers
in shared memory, calls enough to take each slot twice and to wrap the epoch counter. On the
GPU machine `test_distributed_nccl.py` runs it on NCCL ranks.
"""

from __future__ import annotations

import importlib.util
import queue
import re

import pytest
import torch
import torch.distributed as dist
from ranks import spawned
from test_one_shot_all_reduce import SMALL, SPEC, _bf16, _FakeGroup, _one, _runs_on

from opgen.runtime.ir import Collective
from opgen.runtime.passes import run_passes
from opgen.runtime.passes.peer_sum import PEER_SUM_MAX_BYTES

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

PASSES = ["collectives", "one_shot_all_reduce", "peer_sum"]


def test_a_small_one_shot_record_takes_opgens_kernel(registry) -> None:  # type: ignore[no-untyped-def]
    out = run_passes(_one(SMALL), registry, PASSES)
    [record] = out.collectives
    assert (record.kind, record.dtype, record.numel) == ("peer_sum", "bfloat16", 2048)
    assert out.notes[-1] == (
        "one-shot all-reduces of group '0' (bfloat16, up to 4096 bytes): opgen's kernel (`peer_sum`)"
    )


def test_past_its_limit_torchs_kernel_stays(registry) -> None:  # type: ignore[no-untyped-def]
    at_limit = run_passes(_one(_bf16(PEER_SUM_MAX_BYTES // 2)), registry, PASSES)
    over = run_passes(_one(_bf16(PEER_SUM_MAX_BYTES // 2 + 1)), registry, PASSES)
    assert at_limit.collectives[0].kind == "peer_sum"
    assert over.collectives[0].kind == "one_shot_all_reduce" and not any("peer_sum" in n for n in over.notes)


def test_the_artifact_keeps_the_record_through_the_disk_cache_format(registry) -> None:  # type: ignore[no-untyped-def]
    from opgen.runtime.artifact.compiled import CompiledGraph, compiled_graph
    from opgen.runtime.codegen.python import emit

    program = run_passes(_one(SMALL), registry, PASSES)
    graph = compiled_graph("k" * 64, program, emit(program))
    loaded = CompiledGraph.from_json(graph.to_json()).collectives
    assert loaded == graph.collectives and loaded[0].kind == "peer_sum"
    assert re.search(rf"^\s*{loaded[0].local}\(a\)(  #.*)?$", graph.source, re.M), graph.source


def test_where_the_kernel_cannot_run_torchs_kernel_then_the_process_group_take_the_record() -> None:
    from opgen.runtime.execution.collectives import issuer

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the binding would map symmetric memory")
    group = _FakeGroup()
    spec = Collective(SPEC.local, "peer_sum", "0", 2, "sum", node="all_reduce", dtype="bfloat16", numel=2048)
    with pytest.warns(UserWarning) as warned:
        call = issuer(spec, group)
    said = [str(w.message) for w in warned]
    assert any("opgen's one-shot all-reduce kernel cannot run" in s for s in said), said
    assert any("no symmetric memory" in s for s in said), said
    _runs_on(group, call)


# --- the kernel, three ranks in Triton's interpreter ---------------------------------------------------

interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)
WORLD, SLOT, BLOCK = 3, 103, 64
LENGTHS = (100, 40, 100, 100, 40, 100, 40)  # two programs, then one: program 1's epochs fall behind program 0's


def _rank(rank: int, buffers: list[torch.Tensor], counters: torch.Tensor, dtype: torch.dtype, out: queue.Queue
          ) -> None:  # fmt: skip
    """One rank: an all-reduce of fresh values for each of LENGTHS (the same stream of values in every
    rank), each checked against the float32 sum in rank order, rounded to `dtype` (within a rounding in
    bfloat16: Triton's interpreter rounds toward zero, the GPU to nearest); puts (rank, calls that matched,
    its counters after, the last call's result)."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    from opgen.runtime.execution.epoch_words import EPOCHS
    from opgen.runtime.execution.peer_sum_kernel import peer_sum_kernel

    addresses = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    values = torch.Generator().manual_seed(0)
    matched = 0
    for numel in LENGTHS:
        xs = [torch.randn(numel, generator=values).to(dtype) for _ in range(WORLD)]
        x = xs[rank].clone()
        grid = (-(-numel // BLOCK),)
        bits = dtype.itemsize * 8
        peer_sum_kernel[grid](x, addresses, counters, numel, rank, WORLD, SLOT, EPOCHS, BLOCK, bits, False, 0)
        want = torch.zeros(numel)
        for other in xs:
            want += other.float()
        if dtype == torch.float32:
            matched += int(torch.equal(x, want))
        else:
            matched += int(bool(((x.float() - want).abs() <= want.abs() * 2**-7).all()))
    out.put((rank, matched, counters.tolist(), x.tolist()))


@interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_three_ranks_sum_in_rank_order_call_after_call_across_the_epochs_wrap(dtype: torch.dtype) -> None:
    """Words left from an older call (here every word of both slots, as epoch `start`, the counters' value)
    are waited past, not summed: each call's values arrive with its own epoch. Calls of two lengths run
    two programs, then one; each program keeps its own epochs."""
    from opgen.runtime.execution.epoch_words import EPOCHS

    start = EPOCHS - 3  # the counters wrap after three calls
    stale = (start << 32) | 0x7FC07FC0  # a NaN's bits in either dtype, under an older epoch
    buffers = [torch.full((2 * WORLD * SLOT,), stale, dtype=torch.int64).share_memory_() for _ in range(WORLD)]
    counters = [torch.full((2,), start, dtype=torch.int32).share_memory_() for _ in range(WORLD)]
    results = spawned(_rank, [(r, buffers, counters[r], dtype) for r in range(WORLD)], 120)
    both = sum(n > BLOCK for n in LENGTHS)
    after = [(start + len(LENGTHS)) % EPOCHS, (start + both) % EPOCHS]
    assert [result[:3] for result in results] == [(r, len(LENGTHS), after) for r in range(WORLD)]
    assert all(result[3] == results[0][3] for result in results)  # every rank holds the same values


def test_a_tensor_the_buffer_cannot_hold_is_a_clear_error() -> None:
    """The pass gives the record contiguous tensors no larger than its slots; anything else, called by hand,
    raises before a launch (a launch would read past the slot, or the wrong elements)."""
    from opgen.runtime.execution.peer_memory import PeerState
    from opgen.runtime.execution.peer_sum import _Launchers

    none = torch.zeros(2, dtype=torch.int64)
    state = PeerState(16, torch.float32, none, torch.zeros(1, dtype=torch.int32), (), 0, 2, False)
    call = _Launchers(state, 0)
    too_many = "got a tensor of 17 elements (contiguous); its buffer holds 16 contiguous ones"
    with pytest.raises(RuntimeError, match=re.escape(too_many)):
        call(torch.zeros(17))
    with pytest.raises(RuntimeError, match=re.escape("got a tensor of 8 elements (not contiguous)")):
        call(torch.zeros(4, 4)[:, 0:2])
