"""opgen's own one-shot all-gather (`passes.peer_gather`, `execution.peer_gather`, `execution.peer_gather_kernel`).

The pass tests build programs by hand, as `test_one_shot_all_reduce.py` does. The kernel runs in Triton's
interpreter where triton is installed and no GPU is visible: two or three processes, one a rank, their
buffers in shared memory, calls enough to take each slot twice and to wrap the epoch counters. On the
GPU machine `test_distributed_nccl.py` runs it on NCCL ranks.
"""

from __future__ import annotations

import importlib.util
import queue
import re
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import spawned
from test_one_shot_all_reduce import _Work

from opgen.runtime.ir import Alloc, Collective, Input, KernelCall, Line, Program, Ref, Return, TensorMeta, Value
from opgen.runtime.passes import run_passes
from opgen.runtime.passes.peer_gather import PEER_GATHER_MAX_BYTES

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

ALL_GATHER = Collective("c10d_all_gather", "all_gather", "0", 2, node="all_gather")
WAIT = Collective("c10d_wait", "wait")
PASSES = ["collectives", "peer_gather"]


def _meta(shape: tuple[int, ...], dtype: str = "bfloat16", device: str = "cuda:0") -> TensorMeta:
    stride = tuple(int(torch.tensor(shape[i + 1 :]).prod()) for i in range(len(shape)))
    return TensorMeta(shape, stride, dtype, device)


def _lines(numel: int, dtype: str, device: str, record: Collective, part: TensorMeta | None, n: str = ""
           ) -> tuple[Input, list[Line]]:  # fmt: skip
    """`a = x + x`, all-gathered over the record's group into `buf` ([world, 1, numel], as tp_models'
    logits), waited for, then `r = buf * buf` (each name ending in `n`)."""
    world = record.group_size or 2
    part = part or _meta((1, 1, numel), dtype, device)
    whole = _meta((world, 1, numel), dtype, device)
    x, a, buf, work, r = (f"{name}{n}" for name in ("x", "a", "buf", "work_buf", "r"))
    return Input(x, part), [
        KernelCall("add", (Ref(x), Ref(x)), (), (Value(a, part),), a, "aten.add.Tensor"),
        Alloc(Value(buf, whole)),
        KernelCall(record.local, (Ref(buf), Ref(a)), (), (Value(work),), f"all_gather{n}",
                   "_c10d_functional.all_gather_into_tensor.default", mutates=(buf,), jit=True),
        KernelCall("c10d_wait", (Ref(work), Ref(buf), Ref(a)), (), (), f"wait_tensor{n}",
                   "_c10d_functional.wait_tensor.default", mutates=(buf,), jit=True),
        KernelCall("mul", (Ref(buf), Ref(buf)), (), (Value(r, whole),), r, "aten.mul.Tensor"),
    ]  # fmt: skip


def _gathered(numel: int, dtype: str = "bfloat16", device: str = "cuda:0", record: Collective = ALL_GATHER,
              part: TensorMeta | None = None) -> Program:  # fmt: skip
    """One all-gather (`_lines`), its `r` returned."""
    x, body = _lines(numel, dtype, device, record, part)
    return Program("forward", (x,), (), (), (*body, Return((Ref("r"),), "single")), collectives=(record, WAIT))


def _calls(program: Program) -> list[KernelCall]:
    return [line for line in program.body if isinstance(line, KernelCall) and line.jit]


def test_a_small_all_gather_takes_opgens_kernel(registry) -> None:  # type: ignore[no-untyped-def]
    out = run_passes(_gathered(64128), registry, PASSES)  # Llama 3's logits at TP=2: 128 KB a rank
    [record] = out.collectives  # the all_gather and the wait are called by nothing now
    assert record == Collective("c10d_peer_gather_0", "peer_gather", "0", 2, node="all_gather", dtype="bfloat16",
                                numel=64128)  # fmt: skip
    [issue] = _calls(out)  # the wait line is gone
    assert (issue.kernel, issue.args, issue.outputs, issue.mutates) == (
        record.local,
        (Ref("buf"), Ref("a")),
        (),
        ("buf",),
    )
    assert out.notes == (
        "one-shot all-gathers of group '0' (bfloat16, up to 256512 bytes gathered): opgen's kernel (`peer_gather`)",
    )


def test_past_its_limit_the_process_group_stays(registry) -> None:  # type: ignore[no-untyped-def]
    at_limit = run_passes(_gathered(PEER_GATHER_MAX_BYTES // 4), registry, PASSES)  # 2 ranks of 2-byte values
    over = run_passes(_gathered(PEER_GATHER_MAX_BYTES // 4 + 1), registry, PASSES)
    assert [c.kind for c in at_limit.collectives] == ["peer_gather"]
    assert [c.kind for c in over.collectives] == ["all_gather", "wait"]
    assert [c.kernel for c in _calls(over)] == ["c10d_all_gather", "c10d_wait"]
    assert over.notes == (
        "all-gather of node 'all_gather' (1048580 bytes gathered, group '0'): the process group (NCCL on CUDA): "
        "over 1024 KiB gathered (`peer_gather`'s limit)",
    )


def test_float32_and_bfloat16_of_one_group_get_a_record_each_sized_for_the_largest(registry) -> None:  # type: ignore[no-untyped-def]
    parts = [_lines(n, dtype, "cuda:0", ALL_GATHER, None, str(i)) for i, (n, dtype) in
             enumerate([(1000, "float32"), (3000, "bfloat16"), (2000, "bfloat16")])]  # fmt: skip
    returned = Return(tuple(Ref(f"r{i}") for i in range(3)), "tuple")
    both = Program("forward", tuple(x for x, _ in parts), (), (), (*(ln for _, body in parts for ln in body), returned),
                   collectives=(ALL_GATHER, WAIT))  # fmt: skip
    out = run_passes(both, registry, PASSES)
    assert {(c.local, c.dtype, c.numel) for c in out.collectives} == {
        ("c10d_peer_gather_0", "float32", 1000),
        ("c10d_peer_gather_1", "bfloat16", 3000),
    }
    assert [(c.kernel, c.args) for c in _calls(out)] == [
        ("c10d_peer_gather_0", (Ref("buf0"), Ref("a0"))),
        ("c10d_peer_gather_1", (Ref("buf1"), Ref("a1"))),
        ("c10d_peer_gather_1", (Ref("buf2"), Ref("a2"))),
    ]
    assert len(out.notes) == 2 and "(bfloat16, up to 12000 bytes gathered)" in out.notes[1]


@pytest.mark.parametrize(
    ("program", "why"),
    [
        pytest.param(_gathered(1024, device="cpu"), "not a CUDA tensor", id="cpu"),
        pytest.param(
            _gathered(1024, record=replace(ALL_GATHER, group_size=3)),
            "a group of 3 ranks (`peer_gather` takes 2, 4, 6, 8)",
            id="3-ranks",
        ),
        pytest.param(
            _gathered(1024, "int32"), "dtype int32 (`peer_gather` takes float32, bfloat16, float16)", id="int32"
        ),
        pytest.param(
            _gathered(1024, part=TensorMeta((1, 1, 1024), (2048, 2048, 2), "bfloat16", "cuda:0")),
            "not contiguous",
            id="non-contiguous",
        ),
    ],
)
def test_an_all_gather_stays_on_the_process_group(registry, program: Program, why: str) -> None:  # type: ignore[no-untyped-def]
    before = run_passes(program, registry, ["collectives"])
    out = run_passes(program, registry, PASSES)
    assert out.body == before.body and out.collectives == before.collectives
    [note] = out.notes
    assert note.startswith("all-gather of node 'all_gather' (") and note.endswith(f"(NCCL on CUDA): {why}"), note


def test_the_artifact_keeps_the_record_through_the_disk_cache_format(registry) -> None:  # type: ignore[no-untyped-def]
    from opgen.runtime.artifact.compiled import CompiledGraph, compiled_graph
    from opgen.runtime.codegen.python import emit

    program = run_passes(_gathered(4096), registry, PASSES)
    graph = compiled_graph("k" * 64, program, emit(program))
    loaded = CompiledGraph.from_json(graph.to_json()).collectives
    assert loaded == graph.collectives and [(c.kind, c.dtype, c.numel) for c in loaded] == [
        ("peer_gather", "bfloat16", 4096)
    ]
    assert f'{loaded[0].local} = rt.jit["{loaded[0].local}"]' in graph.source
    assert re.search(rf"^\s*{loaded[0].local}\(buf, a\)(  #.*)?$", graph.source, re.M), graph.source
    assert "c10d_wait" not in graph.source and "c10d_all_gather(" not in graph.source


# --- the binding: no GPU here, so the process group ---------------------------------------------------


class _FakeGroup:
    """`group_name` and `_allgather_base(out, tensor, opts)`, as a ProcessGroup has: two ranks, the peer's
    part its rank's values negated."""

    group_name = "0"

    def __init__(self) -> None:
        self.calls = 0

    def _allgather_base(self, out: torch.Tensor, tensor: torch.Tensor, opts: Any) -> _Work:
        self.calls += 1
        out.copy_(torch.cat([tensor, -tensor]).view_as(out))
        return _Work()


SPEC = Collective("c10d_peer_gather_0", "peer_gather", "0", 2, node="all_gather", dtype="bfloat16", numel=2048)


def test_where_the_kernel_cannot_run_the_process_group_takes_the_record() -> None:
    from opgen.runtime.execution.collectives import issuer

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the binding would map symmetric memory")
    group = _FakeGroup()
    with pytest.warns(UserWarning, match="opgen's one-shot all-gather kernel cannot run on group '0'"):
        call = issuer(SPEC, group)
    tensor = torch.arange(2048, dtype=torch.bfloat16)
    out = torch.empty(2, 1, 2048, dtype=torch.bfloat16)
    assert call(out, tensor) is None and group.calls == 1
    assert torch.equal(out.flatten(), torch.cat([tensor, -tensor]))


def test_a_tensor_the_buffer_cannot_hold_is_a_clear_error() -> None:
    """The pass gives the record contiguous tensors no larger than its parts, and outputs of the group's
    size; anything else, called by hand, raises before a launch."""
    from opgen.runtime.execution.peer_gather import _Launchers
    from opgen.runtime.execution.peer_memory import PeerState

    none = torch.zeros(2, dtype=torch.int64)
    state = PeerState(16, torch.bfloat16, none, torch.zeros(1, dtype=torch.int32), (), 0, 2, False)
    call = _Launchers(state, 0)
    out = torch.zeros(66, dtype=torch.bfloat16)
    too_many = "got a tensor of 33 elements of torch.bfloat16 (contiguous); its buffer holds 32 contiguous ones"
    with pytest.raises(RuntimeError, match=re.escape(too_many)):
        call(out, torch.zeros(33, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=re.escape("got a tensor of 8 elements of torch.float32")):
        call(out[:16], torch.zeros(8))
    with pytest.raises(RuntimeError, match=re.escape("(not contiguous)")):
        call(out, torch.zeros(8, 8, dtype=torch.bfloat16)[:, :2])
    with pytest.raises(RuntimeError, match=re.escape("of 8 elements over 2 ranks got an output of 66 elements")):
        call(out, torch.zeros(8, dtype=torch.bfloat16))


# --- the kernel, ranks in Triton's interpreter ---------------------------------------------------------

interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)
NUMEL, WORDS, CALLS = 101, 16, 6  # odd, and not a whole number of programs (16 words each)


def _slot(dtype: torch.dtype) -> int:
    """Words a rank's part of a slot holds: NUMEL's, rounded up to whole programs (as the binding does)."""
    pack = 4 // dtype.itemsize
    return -(-NUMEL // (WORDS * pack)) * WORDS


def _values(call: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s tensor of call `call`: random bits made finite values, the same in every process."""
    values = torch.randn(NUMEL, generator=torch.Generator().manual_seed(1000 * call + rank))
    return values.to(dtype)


def _rank(rank: int, world: int, buffers: list[torch.Tensor], counters: torch.Tensor, dtype: torch.dtype,
          out: queue.Queue) -> None:  # fmt: skip
    """One rank: CALLS all-gathers, each checked bit for bit against the ranks' tensors concatenated; puts
    (rank, calls that matched, its counters after)."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    from opgen.runtime.execution.epoch_words import EPOCHS
    from opgen.runtime.execution.peer_gather_kernel import peer_gather_kernel

    pack = 4 // dtype.itemsize
    addresses = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    grid = (-(-NUMEL // (WORDS * pack)),)
    matched = 0
    for call in range(CALLS):
        gathered = torch.full((world * NUMEL,), float("nan"), dtype=dtype)
        peer_gather_kernel[grid](_values(call, rank, dtype), gathered, addresses, counters, NUMEL, rank, world,
                                 _slot(dtype), EPOCHS, WORDS * pack, pack, False, 0)  # fmt: skip
        want = torch.cat([_values(call, r, dtype) for r in range(world)])
        matched += int(torch.equal(gathered.view(torch.int16 if pack == 2 else torch.int32),
                                   want.view(torch.int16 if pack == 2 else torch.int32)))  # fmt: skip
    out.put((rank, matched, counters.tolist()))


@interpreter
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_ranks_gather_call_after_call_across_the_epochs_wrap(world: int, dtype: torch.dtype) -> None:
    """Words left from an older call (here every word of both slots, as epoch `start`, the counters' value)
    are waited past, not copied; every word a rank reads is zero afterwards."""
    from opgen.runtime.execution.epoch_words import EPOCHS

    start = EPOCHS - 3  # the counters wrap after three calls
    stale = (start << 32) | 0x7FC07FC0  # a NaN's bits in either dtype, under an older epoch
    slot = _slot(dtype)
    programs = slot // WORDS
    buffers = [torch.full((2 * world * slot,), stale, dtype=torch.int64).share_memory_() for _ in range(world)]
    counters = [torch.full((programs,), start, dtype=torch.int32).share_memory_() for _ in range(world)]
    results = spawned(_rank, [(r, world, buffers, counters[r], dtype) for r in range(world)], 180)
    assert results == [(r, CALLS, [(start + CALLS) % EPOCHS] * programs) for r in range(world)]
    words = -(-NUMEL // (4 // dtype.itemsize))  # the words a call sends each peer
    for rank, buffer in enumerate(buffers):
        parts = buffer.view(2, world, slot)
        for peer in range(world):
            if peer != rank:
                assert not parts[:, peer, :words].any(), (rank, peer)  # read, then zeroed
                assert (parts[:, peer, words:] == stale).all(), (rank, peer)  # past the tensor: never written
