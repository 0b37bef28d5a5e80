"""The size memo (passes.memo) and size classes (size_classes): dynamic functions at the static speed, still correct."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.export import Dim

import opgen
from opgen.bench.models import GPTBlock
from opgen.runtime.codegen.python import emit
from opgen.runtime.execution.size_classes import sub_ranges
from opgen.runtime.ir import (
    Alloc,
    Input,
    KernelCall,
    Program,
    Ref,
    Return,
    SizeExpr,
    SizeLet,
    TensorConstant,
    TensorMeta,
    Value,
    View,
)
from opgen.runtime.ir.sizes import SizeRange
from opgen.runtime.passes.memo import memoize_sizes

S = SizeExpr("s0", ("s0",))
SEQ = Dim("seq", min=1, max=64)


def _cell(fn, name: str):  # type: ignore[no-untyped-def]
    return fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents


WIDTH = 128  # the MLP's 128x512 linears reach prepack.MIN_MACS at 64 rows: packed, split at MIN_ROWS


def _block() -> nn.Module:
    torch.manual_seed(0)
    return GPTBlock(width=WIDTH, heads=2, tokens=65).eval()


@pytest.mark.parametrize("backend", ["python", "cpp"])  # the C++ executor runs the memo's lines every call
def test_sizes_back_and_forth_match_eager_including_1_and_the_bounds(backend: str) -> None:
    model = _block()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(1, 9, WIDTH),), dynamic_shapes=({1: SEQ},), cache=False, backend=backend)
        assert "size memo" in fn.artifact.source
        assert backend == "python" or type(fn).__name__ == "CppFunction"
        for t in (1, 64, 1, 7, 8, 64, 33, 33, 1, 2, 2, 64, 9, 9):
            x = torch.randn(1, t, WIDTH)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
            if 8 <= t and backend == "python":  # the handle serves the class from 8 rows; its memo holds the last size
                assert _cell(fn, "_memo_key") == t
    assert fn.report().specializations == 1


def test_a_range_crossing_min_rows_compiles_two_size_classes_without_the_per_call_choice() -> None:
    model = _block()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(1, 3, WIDTH),), dynamic_shapes=({1: SEQ},), cache=False)
        small = fn.artifact  # the handle: the class of the example's size
        x = torch.randn(1, 20, WIDTH)
        torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)  # served by the other class
    assert small.ranges[0][1:] == (1, 7) and not small.splits
    assert "linear_rows" not in small.source and "addmm_out" in small.source  # planned like a static product
    assert fn.report().specializations == 1


class Accumulate(nn.Module):
    """A buffer the graph writes, read back (negated: a call, not a view) over the call's length."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(64))
        self.register_buffer("scale", torch.arange(64.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        self.acc[:t] += x
        return -self.acc[:t] * 2 + (-self.scale[:t])


def test_a_buffer_the_graph_writes_is_never_memoised_stale() -> None:
    model, reference = Accumulate(), Accumulate()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(5),), dynamic_shapes=({0: Dim("t", min=1, max=64)},), cache=False)
        for t in (3, 3, 5, 3, 1, 1, 64, 64):
            x = torch.randn(t)
            torch.testing.assert_close(fn(x), reference(x))
    torch.testing.assert_close(model.acc, reference.acc)
    assert "size memo" in fn.artifact.source  # `-scale[:t]` reads a constant only: memoised


class Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(x.shape)


@pytest.mark.parametrize("dynamic", [False, True])
def test_random_ops_draw_anew_on_every_call(dynamic: bool) -> None:
    shapes = ({0: Dim("n", min=1, max=32)},) if dynamic else None
    with torch.no_grad():
        fn = opgen.compile(Noisy(), (torch.zeros(16),), dynamic_shapes=shapes, cache=False)
        z = torch.zeros(16)
        assert not torch.equal(fn(z), fn(z))


def _memo_program(*body: object, escapes: tuple[str, ...] = ()) -> Program:
    x = Input("x", TensorMeta((S, 4), (4, 1), "float32", "cpu"))
    slot = Value("slot0", TensorMeta((64,), (1,), "float32", "cpu"))
    const = TensorConstant("mask", "mask", TensorMeta((16, 16), (16, 1), "bool", "cpu"))
    lines = (SizeLet("s0", "x.shape[0]", ("x",)), *body, Return(tuple(Ref(n) for n in escapes), "tuple"))
    return Program("forward", (x,), (const,), (Alloc(slot),), lines, ranges=(("s0", 1, 16),))


def _call(kernel: str, *args: object, out: str | None = None, mutates: tuple[str, ...] = ()) -> KernelCall:
    outputs = (Value(out, TensorMeta((S, 4), (4, 1), "float32", "cpu")),) if out else ()
    kwargs = (("out", Ref(mutates[0])),) if mutates else ()
    return KernelCall(kernel, tuple(args), kwargs, outputs, kernel, f"aten.{kernel}", mutates=mutates)


def test_the_memo_takes_views_and_constant_calls_only(registry) -> None:
    view = View(Value("v", TensorMeta((S, 4), (4, 1), "float32", "cpu")), "slot0")
    sliced = _call("slice", Ref("mask"), 0, None, S, out="m")
    negated = _call("bitwise_not", Ref("m"), out="nm")
    per_call = _call("relu", Ref("x"), out="r")
    written = _call("relu_out", Ref("x"), mutates=("v",))
    returned = _call("bitwise_not", Ref("m"), out="back")
    out = memoize_sizes(
        _memo_program(view, sliced, negated, per_call, written, returned, escapes=("r", "back")), registry
    )
    assert [getattr(line, "kernel", "view") for line in out.memo] == ["view", "slice", "bitwise_not"]
    assert [line.kernel for line in out.body if isinstance(line, KernelCall)] == ["relu", "relu_out", "bitwise_not"]
    text = emit(out).text
    assert "nonlocal _memo_key" in text and "if _memo_key != s0:" in text


def test_an_out_buffer_another_line_writes_is_not_memoised(registry) -> None:
    first = View(Value("v", TensorMeta((S, 4), (4, 1), "float32", "cpu")), "slot0")
    second = View(Value("w", TensorMeta((S, 4), (4, 1), "float32", "cpu")), "slot0")
    sliced = _call("slice", Ref("mask"), 0, None, S, out="m")
    into_v = _call("bitwise_not_out", Ref("m"), mutates=("v",))
    into_w = _call("relu_out", Ref("x"), mutates=("w",))  # the same slot, written per call
    out = memoize_sizes(_memo_program(first, second, sliced, into_v, into_w), registry)
    assert [line.kernel for line in out.body if isinstance(line, KernelCall)] == ["bitwise_not_out", "relu_out"]


def test_static_programs_are_left_alone(registry) -> None:
    program = _memo_program()
    static = Program(program.name, program.inputs, program.constants, program.setup, program.body[1:])
    assert memoize_sizes(static, registry) == static


def test_sub_ranges_cut_where_the_passes_asked() -> None:
    seq, batch = SizeRange("s0", 1, 256), SizeRange("s1", 1, 16)
    assert sub_ranges((seq,), [("s0", 8)]) == [(SizeRange("s0", 1, 7),), (SizeRange("s0", 8, 256),)]
    assert sub_ranges((SizeRange("s0", 8, 256),), [("s0", 8)]) == [(SizeRange("s0", 8, 256),)]
    assert sub_ranges((SizeRange("s0", 1, None),), [("s0", 8)])[1] == (SizeRange("s0", 8, None),)
    assert len(sub_ranges((seq, batch), [("s0", 8), ("s1", 8)])) == 4
    many = (seq, batch, SizeRange("s2", 1, 9))
    assert sub_ranges(many, [("s0", 8), ("s1", 8), ("s2", 8)]) == [many]  # too many classes: the whole range


def test_the_memo_does_not_survive_as_module_state() -> None:
    """Two compiles of one model keep separate memos (closure variables of each generated Python function)."""
    model = _block()
    options = {"dynamic_shapes": ({1: SEQ},), "cache": False, "backend": "python"}
    with torch.no_grad():
        a = opgen.compile(model, (torch.randn(1, 9, WIDTH),), **options)
        b = opgen.compile(copy.deepcopy(model), (torch.randn(1, 9, WIDTH),), **options)
        a(torch.randn(1, 12, WIDTH))
        b(torch.randn(1, 20, WIDTH))
    assert _cell(a, "_memo_key") == 12 and _cell(b, "_memo_key") == 20
