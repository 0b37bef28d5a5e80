"""Tensor-parallel graphs over torch.distributed: collectives lowered, overlapped and bound to their groups.

The multi-process tests run their cases (`distributed_cases.py`) in two processes with a gloo group on
127.0.0.1: a pair of ranks started once per module, each case sent to both and bounded in time (a hang
fails the test and the ranks are killed and started again). The IR tests need no process group.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from opgen.runtime.ir import Alloc, Collective, KernelCall, Line, Program, Ref, Return, TensorMeta, Value, View
from opgen.runtime.passes import run_passes

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLD = 2
CASE_SECONDS = 50  # one case in both ranks; tests run well under a minute


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(rank: int, world: int, port: int, cache: str, inbox: Any, outbox: Any) -> None:
    """One rank: join the group, then run each case name it is sent until it is sent None."""
    import datetime
    import os

    os.environ["OPGEN_CACHE_DIR"] = cache

    import distributed_cases

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=CASE_SECONDS),
    )  # fmt: skip
    try:
        while (name := inbox.get()) is not None:
            try:
                outbox.put((rank, "ok", distributed_cases.CASES[name](rank, world)))
            except BaseException:  # sent to the test, which fails with it
                outbox.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class Ranks:
    """`world` processes in one gloo group, each running the cases it is sent."""

    def __init__(self, world: int, cache: str) -> None:
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.procs = [
            ctx.Process(target=_serve, args=(r, world, port, cache, self.inboxes[r], self.outbox), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(self, case: str, timeout: float = CASE_SECONDS) -> list[Any]:
        """Each rank's result, by rank; a rank's exception fails the test with its traceback."""
        for box in self.inboxes:
            box.put(case)
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(results) < len(self.procs):
            try:
                rank, status, value = self.outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.close()
                    why = f"{', '.join(dead)} died" if dead else f"it did not finish in {timeout:g} s"
                    pytest.fail(f"case {case!r} failed: {why} (ranks stopped)")
                continue
            if status == "error":
                self.close()
                pytest.fail(f"case {case!r} failed in rank {rank}:\n{value}")
            results[rank] = value
        return [results[r] for r in range(len(self.procs))]

    def close(self) -> None:
        for box in self.inboxes:
            box.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    cache = str(tmp_path_factory.mktemp("opgen-cache-ranks"))
    holder = [Ranks(WORLD, cache)]

    def get() -> Ranks:
        if not holder[0].alive():
            holder[0].close()
            holder[0] = Ranks(WORLD, cache)
        return holder[0]

    yield _Lazy(get)  # type: ignore[misc]
    holder[0].close()


class _Lazy:
    """The module's ranks, started again if a failed case killed them."""

    def __init__(self, get: Any) -> None:
        self._get = get

    def run(self, case: str, timeout: float = CASE_SECONDS) -> list[Any]:
        return self._get().run(case, timeout)


def _close(errors: dict[str, float], atol: float = 1e-5) -> None:
    assert all(e <= atol for e in errors.values()), errors


# --- two ranks ---------------------------------------------------------------------------------


def test_tensor_parallel_mlp_matches_the_whole_model(ranks: Ranks) -> None:
    for errors in ranks.run("tp_mlp"):
        _close(errors)


def test_tensor_parallel_transformer_block_matches_the_whole_model(ranks: Ranks) -> None:
    for errors in ranks.run("tp_block"):
        _close(errors)


def test_dtensor_parallelize_module_plan_matches_the_whole_model(ranks: Ranks) -> None:
    for errors in ranks.run("dtensor_plan"):
        _close(errors)
        assert "torch.compile" in errors and ("opgen.compile" in errors or "export refuses" in errors), errors


def test_every_functional_collective_matches_eager(ranks: Ranks) -> None:
    kinds = ["all_gather", "all_reduce", "all_reduce_coalesced", "all_to_all", "broadcast", "reduce_scatter", "wait"]
    for result in ranks.run("collectives"):
        assert result["kinds"] == kinds
        assert result["waits"] == 6  # one per collective (the coalesced one waits once for both outputs)
        exact = ("opgen.compile", "torch.compile", "opgen.compile backend=cpp")
        _close({k: v for k, v in result.items() if k in exact}, atol=0)


def test_a_wait_goes_after_the_compute_that_does_not_need_its_result(ranks: Ranks) -> None:
    for result in ranks.run("overlap"):
        issue, independent, wait = result["order"]
        assert issue < independent < wait, result
        assert result["copies"] == 0, result  # dist.all_reduce(y) works on y itself: no clone, no copy back
        assert result["error"] == 0.0


def test_a_group_of_another_size_than_the_graph_was_traced_for_is_a_clear_error(ranks: Ranks) -> None:
    for message in ranks.run("wrong_group_size"):
        assert "compiled for a process group of 4 ranks, but group '0' here has 2" in message, message


# --- one process, no process group ---------------------------------------------------------------


class _AllReduce(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x * 2, "sum", "0"))


def test_without_a_process_group_compiling_is_a_clear_error() -> None:
    import opgen
    from opgen.runtime.execution.collectives import ProcessGroupError

    assert not dist.is_initialized()
    with pytest.raises(ProcessGroupError, match="no process group is initialised in this process"):
        opgen.compile(_AllReduce(), (torch.ones(4),))


def test_the_cache_key_holds_the_size_of_each_group_the_graph_names() -> None:
    from opgen.runtime.lowering.collectives import group_sizes

    graph = torch.export.export(_AllReduce(), (torch.ones(4),)).graph_module
    assert group_sizes(graph) == (("0", None),)  # no group here: compiled apart from a world where it has a size


def test_an_unknown_group_name_is_a_clear_error() -> None:
    from opgen.runtime.execution.collectives import ProcessGroupError, bindings

    spec = Collective("c10d_all_reduce", "all_reduce", "no-such-group", 2, "sum", node="all_reduce")
    with pytest.raises(ProcessGroupError, match="graph node 'all_reduce' runs all_reduce on process group"):
        bindings([spec])


# --- the pass and the memory plan on hand-written programs ----------------------------------------

META = TensorMeta((16,), (1,), "float32", "cpu")
WIDE = TensorMeta((32,), (1,), "float32", "cpu")
COLLECTIVES = (Collective("c10d_all_reduce", "all_reduce", "0", 2, "sum"),
               Collective("c10d_all_gather", "all_gather", "0", 2), Collective("c10d_wait", "wait"))  # fmt: skip


def _call(kernel: str, args: tuple, out: str | None, meta: TensorMeta = META, **kw: object) -> KernelCall:
    outputs = (Value(out, meta),) if out else ()
    return KernelCall(kernel, args, (), outputs, out or kernel, f"aten.{kernel}.Tensor", **kw)  # type: ignore[arg-type]


def _program(body: list[Line]) -> Program:
    from opgen.runtime.ir import Input

    return Program("forward", (Input("x", META),), (), (), tuple(body), collectives=COLLECTIVES)


def _issue(kernel: str, args: tuple, writes: tuple[str, ...]) -> KernelCall:
    return KernelCall(kernel, args, (), (Value("work"),), "c", "_c10d_functional.x.default", mutates=writes, jit=True)


def _wait(*tensors: str, writes: tuple[str, ...]) -> KernelCall:
    args = (Ref("work"), *(Ref(t) for t in tensors))
    return KernelCall("c10d_wait", args, (), (), "w", "_c10d_functional.wait_tensor.default", mutates=writes, jit=True)


def _order(program: Program) -> list[str]:
    return [line.kernel if isinstance(line, KernelCall) else type(line).__name__ for line in program.body]


def test_the_pass_issues_early_waits_late_and_drops_the_clone(registry) -> None:  # type: ignore[no-untyped-def]
    body: list[Line] = [
        _call("add", (Ref("x"), Ref("x")), "a"),
        _call("mul", (Ref("x"), Ref("x")), "m"),  # independent of the collective: the issue moves above it
        KernelCall("clone", (Ref("a"),), (), (Value("c", META),), "c", "aten.clone.default"),
        _issue("c10d_all_reduce", (Ref("c"),), ("c",)),
        _wait("c", writes=("c",)),
        _call("sin", (Ref("m"),), "s"),  # also independent: the wait moves below it
        _call("add", (Ref("c"), Ref("s")), "r"),
        Return((Ref("r"),), "single"),
    ]
    out = run_passes(_program(body), registry, ["collectives"])
    assert _order(out) == ["add", "Comment", "c10d_all_reduce", "mul", "sin", "c10d_wait", "add", "Return"]
    issue = out.body[2]
    assert isinstance(issue, KernelCall) and issue.args == (Ref("a"),)  # on `a` itself: nothing reads it later


def test_the_wait_stays_before_a_write_of_what_the_collective_reads(registry) -> None:  # type: ignore[no-untyped-def]
    body: list[Line] = [
        _call("add", (Ref("x"), Ref("x")), "a"),
        Alloc(Value("g", WIDE)),
        _issue("c10d_all_gather", (Ref("g"), Ref("a")), ("g",)),
        _wait("g", "a", writes=("g",)),
        _call("mul", (Ref("a"), Ref("a")), "m"),  # reads the input in flight: may run before the wait
        KernelCall("relu_", (Ref("a"),), (), (), "w", "aten.relu_.default", mutates=("a",)),  # writes it: may not
        Return((Ref("g"), Ref("m")), "tuple"),
    ]
    out = run_passes(_program(body), registry, ["collectives"])
    assert _order(out) == ["add", "Alloc", "c10d_all_gather", "mul", "c10d_wait", "relu_", "Return"]


def test_the_memory_plan_never_hands_a_buffer_in_flight_to_another_value(registry) -> None:  # type: ignore[no-untyped-def]
    def slots(body: list[Line]) -> dict[str, str]:
        planned = run_passes(_program(body), registry, ["memory"])
        return {line.value.name: line.source for line in planned.setup if isinstance(line, View)}

    def body(in_flight: tuple[str, ...]) -> list[Line]:
        return [
            _call("add", (Ref("x"), Ref("x")), "a"),
            Alloc(Value("g", WIDE)),
            _issue("c10d_all_gather", (Ref("g"), Ref("a")), ("g",)),
            _call("mul", (Ref("x"), Ref("x")), "m"),  # runs while `a` is being sent
            _call("add", (Ref("m"), Ref("x")), "n"),
            _wait(*in_flight, writes=("g",)),
            _call("cat", ((Ref("g"), Ref("n")),), "r", TensorMeta((48,), (1,), "float32", "cpu")),
            Return((Ref("r"),), "single"),
        ]

    planned = slots(body(("g", "a")))
    assert planned["m"] != planned["a"], planned  # (`n` is written in place into `m`)
    unlisted = slots(body(("g",)))  # were `a` not listed as in flight, its buffer would be reused at once
    assert unlisted["m"] == unlisted["a"], unlisted


def test_the_artifact_keeps_the_collectives_through_the_disk_cache_format(registry) -> None:  # type: ignore[no-untyped-def]
    from opgen.runtime.artifact.compiled import CompiledGraph, compiled_graph
    from opgen.runtime.codegen.python import emit

    body: list[Line] = [
        _call("add", (Ref("x"), Ref("x")), "a"),
        Alloc(Value("g", WIDE)),
        _issue("c10d_all_gather", (Ref("g"), Ref("a")), ("g",)),
        _wait("g", "a", writes=("g",)),
        Return((Ref("g"),), "single"),
    ]
    program = _program(body)
    graph = compiled_graph("k" * 64, program, emit(program))
    assert graph.collectives == COLLECTIVES
    assert CompiledGraph.from_json(graph.to_json()).collectives == COLLECTIVES
    assert 'c10d_all_gather = rt.jit["c10d_all_gather"]' in graph.source


def test_a_case_that_hangs_fails_in_time_and_its_ranks_are_stopped(ranks: Ranks) -> None:
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish in 3 s"):
        ranks.run("hang", timeout=3)
    assert time.monotonic() - start < 20
