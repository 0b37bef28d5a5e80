"""torch.profiler sees opgen's kernels: each kernel call of a compiled graph is a range named after its node.

The generated function hands each call to its profiled twin while a profiler is on
(opgen/runtime/codegen/profiled.py); with none on, the plain function runs and no range is opened.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

import opgen
from opgen import kernel_ops
from opgen.bench.models import GPTBlock
from opgen.runtime.artifact.compiled import compiled_graph
from opgen.runtime.codegen import profiled
from opgen.runtime.codegen.python import emit
from opgen.runtime.errors import InputTypeError
from opgen.runtime.execution import executor
from opgen.runtime.execution.guards import PROCEED
from opgen.runtime.ir import Guard, Input, KernelCall, Program, Ref, Return, TensorMeta, Value


class CnnMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(8 * 8 * 8, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(h)))


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return CnnMlp().eval(), torch.randn(2, 3, 8, 8)


def _events(fn: Any, *args: Any) -> tuple[Any, list[Any]]:
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, list(prof.events())


def _kernel_events(events: list[Any]) -> list[Any]:
    """opgen's per-kernel events: `opgen::<node> (<op>)`, inside a graph's range."""
    return [e for e in events if e.name.startswith("opgen::") and _in_graph(e)]


def _in_graph(event: Any) -> bool:
    return event.cpu_parent is not None and event.cpu_parent.name.startswith("opgen::")


def _check_trace(events: list[Any]) -> None:
    kernels = _kernel_events(events)
    names = [e.name for e in kernels]
    assert any("aten.convolution" in n for n in names), names
    assert sum("aten.addmm" in n or "aten.mm" in n or "aten.linear" in n for n in names) >= 2, names
    assert all(n.startswith("opgen::") and " (aten." in n for n in names), names
    graph = {e.cpu_parent.name for e in kernels}
    assert len(graph) == 1 and next(iter(graph)).startswith("opgen::"), graph  # all in one range per graph call
    nested = [e for e in events if e.name.startswith("aten::") and e.cpu_parent in kernels]
    assert nested, "the kernels' own ATen events nest under opgen's ranges"


def test_a_profile_of_opgen_compile_lists_convolutions_and_matrix_products_by_node() -> None:
    model, x = _model()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        fn(x)
        out, events = _events(fn, x)
        torch.testing.assert_close(out, model(x))
    _check_trace(events)
    graph = next(e for e in events if e.name.startswith("opgen::forward"))
    assert "CnnMlp" in graph.name and graph.cpu_parent is None  # opgen.compile adds no range of its own


def test_the_first_call_under_a_profiler_goes_through_the_slow_path_in_the_twin() -> None:
    model, x = _model()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        out, events = _events(fn, x)  # the check is built on this call, inside the twin
        torch.testing.assert_close(out, model(x))
        _check_trace(events)
        torch.testing.assert_close(fn(x), model(x))  # and serves the plain function after
        with torch.profiler.profile(), pytest.raises(InputTypeError, match=r"expected dtype torch\.float32"):
            fn(x.double())


def test_a_profile_of_the_torch_compile_backend_lists_them_too() -> None:
    model, x = _model()
    torch._dynamo.reset()
    with torch.no_grad():
        fn = torch.compile(model, backend="opgen")
        fn(x)
        out, events = _events(fn, x)
        torch.testing.assert_close(out, model(x))
    _check_trace(events)


def test_the_autograd_profiler_sees_them() -> None:
    model, x = _model()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        fn(x)
        with torch.autograd.profiler.profile() as prof:
            fn(x)
    names = [e.name for e in prof.function_events]
    assert any(n.startswith("opgen::") and "aten.convolution" in n for n in names), names


def test_the_twin_shares_the_size_memo_of_a_dynamic_function() -> None:
    torch.manual_seed(0)
    model = GPTBlock(width=32, heads=2, tokens=65).eval()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(1, 9, 32),), dynamic_shapes=({1: Dim("seq", min=1, max=64)},))
        assert "size memo" in fn.artifact.source and "nonlocal _memo_key" in fn.artifact.source
        for t in (9, 12, 12, 9):
            x = torch.randn(1, t, 32)
            with torch.profiler.profile() as prof:
                torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
            assert any(e.name.startswith("opgen::") for e in prof.events())
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)  # plain, after the twin filled the memo


# The executor level: a hand-built program, bound with a counting range.

META = TensorMeta((4,), (1,), "float32", "cpu")
ADD = KernelCall("add", (Ref("x"), Ref("y")), (), (Value("buf0", META),), "add", "aten.add.Tensor")
MUL = KernelCall("mul", (Ref("buf0"), Ref("y")), (), (Value("buf1", META),), "mul_1", "aten.mul.Tensor")
PROGRAM = Program(
    "forward",
    (Input("x", META), Input("y", META)),
    (),
    (),
    (Guard(("x", "y")), ADD, MUL, Return((Ref("buf1"),), "single")),
)


class Counting:
    """A stand-in for `_RecordFunctionFast` that counts the ranges opened."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str) -> Any:
        self.names.append(name)
        return torch._C._profiler._RecordFunctionFast(name)


def _bind(record: Counting, profiled_: bool = True) -> Any:
    graph = compiled_graph("a" * 64, PROGRAM, emit(PROGRAM, header="test", profiled=profiled_))
    rt = executor.Runtime(lambda set_check, *a: PROCEED, record=record)
    return executor.bind(graph, {}, rt, kernel_ops)


def test_with_no_profiler_the_plain_function_runs_and_opens_no_range() -> None:
    record = Counting()
    fn = _bind(record)
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(fn(x, y), (x + y) * y)
    assert record.names == []
    with torch.profiler.profile():
        torch.testing.assert_close(fn(x, y), (x + y) * y)
    assert record.names == [
        "opgen::forward (test)",
        "opgen::add (aten.add.Tensor)",
        "opgen::mul_1 (aten.mul.Tensor)",
    ]
    fn(x, y)  # the profiler is off again: the plain function
    assert len(record.names) == 3


def test_without_the_twin_a_profiler_changes_nothing() -> None:
    source = emit(PROGRAM, profiled=False).text
    assert "_profiler" not in source and "_record" not in source and "forward_profiled" not in source
    record = Counting()
    fn = _bind(record, profiled_=False)
    x, y = torch.randn(4), torch.randn(4)
    with torch.profiler.profile():
        torch.testing.assert_close(fn(x, y), (x + y) * y)
    assert record.names == []


def test_the_twin_is_the_same_body_with_each_kernel_call_in_a_range() -> None:
    text = emit(PROGRAM, header="test").text
    plain, twin = text.split("def forward_profiled(x, y):")
    assert "if _profiler._is_profiler_enabled:" in plain and "return forward_profiled(x, y)" in plain
    assert '    with _record("opgen::forward (test)"):' in twin
    assert '            with _record("opgen::add (aten.add.Tensor)"):\n                buf0 = add(x, y)' in twin
    assert "_profiler" not in twin
    strip = [line.strip() for line in twin.splitlines() if "_record" not in line]
    assert [s for s in strip if s.endswith("aten.add.Tensor")] == ["buf0 = add(x, y)  # add: aten.add.Tensor"]


def test_range_names_are_valid_python_strings_whatever_the_node_name() -> None:
    odd = KernelCall("add", (Ref("x"),), (), (Value("b"),), 'add "quoted" \\ node', "aten.add.Tensor")
    assert profiled.range_name(odd) == 'opgen::add "quoted" \\ node (aten.add.Tensor)'
    (with_line, call) = profiled.in_range(["b = add(x)"], profiled.range_name(odd))
    node = ast.parse(with_line + "\n" + call).body[0]
    assert isinstance(node, ast.With) and call == "    b = add(x)"
    assert ast.literal_eval(node.items[0].context_expr.args[0]) == profiled.range_name(odd)  # type: ignore[attr-defined]
    assert profiled.graph_range_name("forward") == "opgen::forward"
