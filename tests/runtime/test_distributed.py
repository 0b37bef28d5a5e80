"""Tensor-parallel graphs over torch.distributed: collectives lowered, overlapped and bound to their groups.

The multi-process tests run their cases (`distributed_cases.py`) in two processes with a gloo group on
127.0.0.1: a pair of ranks started once per module, each case sent to both and bounded in time (a hang
fails the test and the ranks are killed and started again). The IR tests need no process group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from ranks import Ranks, started

from opgen.runtime.ir import Alloc, Collective, KernelCall, Line, Program, Ref, Return, TensorMeta, Value, View
from opgen.runtime.passes import run_passes

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ranks]:
    yield from started(WORLD, str(tmp_path_factory.mktemp("opgen-cache-ranks")))


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


def test_the_clone_of_a_reshaped_product_goes_and_its_buffer_stays_out_of_reach(registry) -> None:  # type: ignore[no-untyped-def]
    """A row-parallel product reaches its all_reduce reshaped (`x @ w.T` viewed as [1, 16]): the collective works
    on that view in place, and the product's buffer is not handed to a value made while it is in flight."""
    row = TensorMeta((1, 16), (16, 1), "float32", "cpu")
    body: list[Line] = [
        _call("mul", (Ref("x"), Ref("x")), "a"),
        KernelCall("view", (Ref("a"), (1, 16)), (), (Value("v", row),), "v", "aten.view.default"),
        KernelCall("clone", (Ref("v"),), (), (Value("c", row),), "c", "aten.clone.default"),
        _issue("c10d_all_reduce", (Ref("c"),), ("c",)),
        _call("add", (Ref("x"), Ref("x")), "m"),  # made while the all-reduce runs: another buffer than `a`
        _call("sin", (Ref("m"),), "s"),
        _wait("c", writes=("c",)),
        _call("add", (Ref("c"), Ref("s")), "r", row),
        Return((Ref("r"),), "single"),
    ]
    out = run_passes(_program(body), registry, ["collectives"])
    issue = next(line for line in out.body if isinstance(line, KernelCall) and line.kernel == "c10d_all_reduce")
    assert issue.args == (Ref("v"),) and "clone" not in _order(out), out.body
    planned = run_passes(out, registry, ["memory"])
    slots = {line.value.name: line.source for line in planned.setup if isinstance(line, View)}
    assert "a" in slots and slots["m"] != slots["a"], slots
    again = [*body[:4], _call("neg", (Ref("a"),), "n"), *body[4:-1], Return((Ref("r"), Ref("n")), "tuple")]
    kept = run_passes(_program(again), registry, ["collectives"])  # the product read after: the clone stays
    assert "clone" in _order(kept), kept.body


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
