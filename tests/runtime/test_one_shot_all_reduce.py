"""Small CUDA all-reduces through a one-shot all-reduce over peer memory (`passes.one_shot_all_reduce`).

The pass tests build programs by hand: a CUDA `TensorMeta` is only data, so no GPU is needed. The
binding test runs on this machine's torch, which has no symmetric memory to map, and checks that the
record falls back to the process group (a fake one here).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from opgen.runtime.ir import Collective, Input, KernelCall, Line, Program, Ref, Return, TensorMeta, Value
from opgen.runtime.passes import run_passes

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

SMALL = TensorMeta((1, 1, 2048), (2048, 2048, 1), "bfloat16", "cuda:0")  # 4096 bytes
ALL_REDUCE = Collective("c10d_all_reduce", "all_reduce", "0", 2, "sum", node="all_reduce")
WAIT = Collective("c10d_wait", "wait")
PASSES = ["collectives", "one_shot_all_reduce"]


def _bf16(numel: int, device: str = "cuda:0") -> TensorMeta:
    return TensorMeta((1, 1, numel), (numel, numel, 1), "bfloat16", device)


def _call(kernel: str, args: tuple, out: str, meta: TensorMeta) -> KernelCall:
    return KernelCall(kernel, args, (), (Value(out, meta),), out, f"aten.{kernel}.Tensor")


def _issue(tensor: str, work: str, node: str, kernel: str = "c10d_all_reduce") -> KernelCall:
    target = "_c10d_functional.all_reduce_.default"
    return KernelCall(kernel, (Ref(tensor),), (), (Value(work),), node, target, mutates=(tensor,), jit=True)


def _wait(work: str, tensor: str, node: str) -> KernelCall:
    target = "_c10d_functional.wait_tensor.default"
    return KernelCall("c10d_wait", (Ref(work), Ref(tensor)), (), (), node, target, mutates=(tensor,), jit=True)


def _reduced(name: str, source: str, meta: TensorMeta) -> list[Line]:
    """`name = source + source`, all-reduced in place (node `name`), then waited for."""
    work = f"work_{name}"
    return [_call("add", (Ref(source), Ref(source)), name, meta), _issue(name, work, name), _wait(work, name, name)]


def _program(inputs: dict[str, TensorMeta], body: list[Line], records: tuple[Collective, ...] = ()) -> Program:
    records = records or (ALL_REDUCE, WAIT)
    return Program("forward", tuple(Input(n, m) for n, m in inputs.items()), (), (), tuple(body), collectives=records)


def _one(meta: TensorMeta, record: Collective = ALL_REDUCE) -> Program:
    body = [*_reduced("a", "x", meta), _call("mul", (Ref("a"), Ref("a")), "r", meta), Return((Ref("r"),), "single")]
    return _program({"x": meta}, body, (record, WAIT))


def _calls(program: Program) -> list[KernelCall]:
    return [line for line in program.body if isinstance(line, KernelCall) and line.jit]


def _kinds(program: Program) -> dict[str, Collective]:
    return {c.local: c for c in program.collectives}


def test_a_small_bfloat16_all_reduce_goes_one_shot(registry) -> None:  # type: ignore[no-untyped-def]
    # the functional form: a clone of `a` all-reduced; the collectives pass then works on `a` itself
    body: list[Line] = [
        _call("add", (Ref("x"), Ref("x")), "a", SMALL),
        KernelCall("clone", (Ref("a"),), (), (Value("c", SMALL),), "c", "aten.clone.default"),
        _issue("c", "work_c", "all_reduce"),
        _wait("work_c", "c", "wait_tensor"),
        _call("mul", (Ref("c"), Ref("c")), "r", SMALL),
        Return((Ref("r"),), "single"),
    ]
    out = run_passes(_program({"x": SMALL}, body), registry, PASSES)

    [record] = out.collectives  # the plain all_reduce and the wait are called by nothing now
    assert record == Collective(
        "c10d_one_shot_all_reduce_0", "one_shot_all_reduce", "0", 2, "sum", node="all_reduce",
        dtype="bfloat16", numel=2048,
    )  # fmt: skip
    [issue] = _calls(out)  # the wait line is gone
    assert issue.kernel == record.local and issue.args == (Ref("a"),) and issue.outputs == ()
    assert issue.mutates == ("a",)
    assert not any(isinstance(line, KernelCall) and line.kernel == "c10d_wait" for line in out.body)
    assert out.notes == ("all-reduce of node 'all_reduce' (4096 bytes, group '0'): one-shot over peer memory",)


def test_exactly_512_kib_still_goes_one_shot(registry) -> None:  # type: ignore[no-untyped-def]
    out = run_passes(_one(_bf16(256 * 1024)), registry, PASSES)
    [record] = out.collectives
    assert record.kind == "one_shot_all_reduce" and record.numel == 256 * 1024
    assert "(524288 bytes, group '0'): one-shot" in out.notes[0]


def test_all_reduces_of_one_group_and_dtype_share_a_record_sized_for_the_largest(registry) -> None:  # type: ignore[no-untyped-def]
    little, big = _bf16(512), _bf16(2048)  # the smaller first: the record grows to the larger
    body: list[Line] = [*_reduced("a", "x", little), *_reduced("b", "y", big), Return((Ref("a"), Ref("b")), "tuple")]
    out = run_passes(_program({"x": little, "y": big}, body), registry, PASSES)

    [record] = out.collectives
    assert (record.kind, record.dtype, record.numel) == ("one_shot_all_reduce", "bfloat16", 2048)
    calls = _calls(out)
    assert [(c.kernel, c.args, c.outputs) for c in calls] == [
        (record.local, (Ref("a"),), ()),
        (record.local, (Ref("b"),), ()),
    ]
    assert [n.split(":")[0] for n in out.notes] == [
        "all-reduce of node 'a' (1024 bytes, group '0')",
        "all-reduce of node 'b' (4096 bytes, group '0')",
    ]


def test_float32_and_bfloat16_get_a_record_each(registry) -> None:  # type: ignore[no-untyped-def]
    wide = TensorMeta((1, 1024), (1024, 1), "float32", "cuda:0")
    body: list[Line] = [*_reduced("a", "x", wide), *_reduced("b", "y", SMALL), Return((Ref("a"), Ref("b")), "tuple")]
    out = run_passes(_program({"x": wide, "y": SMALL}, body), registry, PASSES)

    records = _kinds(out)
    assert {(c.kind, c.dtype, c.numel) for c in records.values()} == {
        ("one_shot_all_reduce", "float32", 1024),
        ("one_shot_all_reduce", "bfloat16", 2048),
    }
    called = {c.args[0].name: records[c.kernel].dtype for c in _calls(out)}  # type: ignore[union-attr]
    assert called == {"a": "float32", "b": "bfloat16"}
    assert "(4096 bytes, group '0'): one-shot" in out.notes[0]  # 1024 float32


def test_a_large_all_reduce_beside_a_small_one_keeps_its_record_and_wait(registry) -> None:  # type: ignore[no-untyped-def]
    large = _bf16(512 * 1024)  # 1 MiB
    body: list[Line] = [*_reduced("a", "x", SMALL), *_reduced("b", "y", large), Return((Ref("a"), Ref("b")), "tuple")]
    out = run_passes(_program({"x": SMALL, "y": large}, body), registry, PASSES)

    records = _kinds(out)
    assert set(records) == {"c10d_all_reduce", "c10d_wait", "c10d_one_shot_all_reduce_0"}
    assert [(c.kernel, c.args, c.outputs) for c in _calls(out)] == [
        ("c10d_one_shot_all_reduce_0", (Ref("a"),), ()),
        ("c10d_all_reduce", (Ref("b"),), (Value("work_b"),)),
        ("c10d_wait", (Ref("work_b"), Ref("b")), ()),
    ]
    assert "one-shot over peer memory" in out.notes[0]
    assert "the process group (NCCL on CUDA): over 512 KiB" in out.notes[1]


NON_CONTIGUOUS = TensorMeta((2, 1024), (1, 2), "bfloat16", "cuda:0")  # a transpose


@pytest.mark.parametrize(
    ("meta", "record", "why"),
    [
        pytest.param(_bf16(256 * 1024 + 8), ALL_REDUCE, "over 512 KiB, where the ring wins", id="over-512-KiB"),
        pytest.param(_bf16(2048, "cpu"), ALL_REDUCE, "not a CUDA tensor", id="cpu"),
        pytest.param(SMALL, replace(ALL_REDUCE, reduce_op="avg"), "reduce op 'avg' (one-shot sums only)", id="avg"),
        pytest.param(
            SMALL, replace(ALL_REDUCE, group_size=3), "a group of 3 ranks (one-shot takes 2, 4, 6, 8)", id="3-ranks"
        ),
        pytest.param(
            replace(SMALL, dtype="float16"),
            ALL_REDUCE,
            "dtype float16 (one-shot takes float32, bfloat16)",
            id="float16",
        ),
        pytest.param(NON_CONTIGUOUS, ALL_REDUCE, "not contiguous", id="non-contiguous"),
    ],
)
def test_an_all_reduce_stays_on_the_process_group(registry, meta: TensorMeta, record: Collective, why: str) -> None:  # type: ignore[no-untyped-def]
    before = run_passes(_one(meta, record), registry, ["collectives"])
    out = run_passes(_one(meta, record), registry, PASSES)

    assert out.body == before.body and out.collectives == before.collectives == (record, WAIT)
    assert [c.kernel for c in _calls(out)] == ["c10d_all_reduce", "c10d_wait"]
    assert _calls(out)[0].outputs == (Value("work_a"),)
    [note] = out.notes
    assert note.startswith("all-reduce of node 'a' (")
    assert note.endswith(f"group '0'): the process group (NCCL on CUDA): {why}")


def test_the_artifact_keeps_the_one_shot_record_through_the_disk_cache_format(registry) -> None:  # type: ignore[no-untyped-def]
    from opgen.runtime.artifact.compiled import CompiledGraph, compiled_graph
    from opgen.runtime.codegen.python import emit

    program = run_passes(_one(SMALL), registry, PASSES)
    [record] = program.collectives
    graph = compiled_graph("k" * 64, program, emit(program))
    loaded = CompiledGraph.from_json(graph.to_json()).collectives
    assert loaded == graph.collectives == (record,)
    assert (loaded[0].kind, loaded[0].dtype, loaded[0].numel) == ("one_shot_all_reduce", "bfloat16", 2048)
    assert f'{record.local} = rt.jit["{record.local}"]' in graph.source
    assert re.search(rf"^\s*{record.local}\(a\)(  #.*)?$", graph.source, re.M), graph.source
    assert "c10d_wait" not in graph.source and "c10d_all_reduce(" not in graph.source


# --- the binding: no symmetric memory here, so the process group ----------------------------------


class _Work:
    def wait(self) -> None:
        pass


class _FakeGroup:
    """`group_name` and `allreduce(tensors, opts)`, as a ProcessGroup has: doubles in place (two ranks)."""

    group_name = "0"

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> _Work:
        self.calls.append(opts.reduceOp)
        for t in tensors:
            t.mul_(2)
        return _Work()


SPEC = Collective("c10d_one_shot_all_reduce_0", "one_shot_all_reduce", "0", 2, "sum", node="all_reduce",
                  dtype="bfloat16", numel=2048)  # fmt: skip


def _runs_on(group: _FakeGroup, call: Any) -> None:
    """`call` (the record's callable) sums through `group.allreduce`, in place."""
    tensor = torch.ones(2048, dtype=torch.bfloat16)
    assert call(tensor) is None
    assert len(group.calls) == 1 and group.calls[0] == dist.ReduceOp.SUM
    assert torch.equal(tensor, torch.full((2048,), 2.0, dtype=torch.bfloat16))


def test_without_cuda_devices_the_record_runs_on_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from opgen.runtime.execution.collectives import issuer

    def no_device() -> int:  # what a CUDA build of torch raises on a machine without a GPU
        raise RuntimeError("No CUDA GPUs are available")

    monkeypatch.setattr(torch.cuda, "current_device", no_device)
    group = _FakeGroup()
    with pytest.warns(UserWarning, match="no symmetric memory"):
        call = issuer(SPEC, group)
    _runs_on(group, call)


def test_on_this_torch_the_record_runs_on_the_process_group() -> None:
    from opgen.runtime.execution.collectives import issuer

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the binding would try to map symmetric memory")
    group = _FakeGroup()
    with pytest.warns(UserWarning, match="no symmetric memory"):
        call = issuer(SPEC, group)
    _runs_on(group, call)
