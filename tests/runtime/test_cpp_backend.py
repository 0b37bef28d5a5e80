"""The C++ backend: the executor's program text, its thunks, the tiering, and errors (against eager PyTorch).

test_correctness.py runs every runtime case through both backends; this file covers what is the C++
backend's own: the text it prints, what it refuses (and how the runtime falls back), the executor's
parser, argument and kernel errors, and the thunk emitter.
"""

from __future__ import annotations

import re
import threading
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import opgen
from opgen import _C
from opgen.gen import thunks
from opgen.runtime.codegen import cpp as cpp_backend
from opgen.runtime.errors import InputMismatchError, InputTypeError, OpgenWarning, RequiresGradError
from opgen.runtime.execution.guards import PROCEED
from opgen.runtime.ir import Input, KernelCall, Program, Ref, Return, Sym, TensorMeta, Value
from opgen.runtime.pipeline import default_pipeline, default_registry
from opgen.spec.validate import load_spec

ROOT = Path(__file__).resolve().parents[2]
HEADER = "program f registers 4 statics 0\ninput r0 x float32 cpu [16] [1]\ninput r1 y float32 cpu [16] [1]\n"


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Dynamic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() * 2


def cpp(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], **kwargs: object) -> object:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)  # the program must run on the C++ executor
        return opgen.compile(model, inputs, backend="cpp", **kwargs)


def test_setup_values_come_from_the_python_function() -> None:
    """The weights are packed once, by the Python function's setup: the program binds its values
    (`shared` lines) instead of running those setup lines again."""
    from torch.profiler import profile

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).eval()
    model.requires_grad_(False)
    x = torch.randn(8, 64)
    packs = []
    for backend in ("python", "cpp"):
        with profile() as prof:
            fn = cpp(model, (x,), cache=False) if backend == "cpp" else opgen.compile(model, (x,), cache=False)
        packs.append(sum(e.name.endswith("_reorder_linear_weight") for e in prof.events()))
        with torch.no_grad():
            torch.testing.assert_close(fn(x), model(x))
    assert packs[0] == 2 and packs[1] == 2  # one per weight, with the C++ program bound too
    assert re.search(r"^shared s\d+ \w*packed\d+$", fn.artifact.cpp_program, re.M)  # type: ignore[attr-defined]


def test_the_function_can_be_weakly_referenced() -> None:
    """As a Python function can (caches keyed by compiled functions hold them weakly)."""
    import gc
    import weakref

    fn = cpp(Add(), (torch.randn(16), torch.randn(16)))
    ref = weakref.ref(fn)
    assert ref() is fn
    del fn
    gc.collect()
    assert ref() is None


def test_copies_are_the_function_itself() -> None:
    """As for a Python function: a module holding a compiled function deep-copies."""
    import copy

    fn = cpp(Add(), (torch.randn(16), torch.randn(16)))
    assert copy.copy(fn) is fn and copy.deepcopy(fn) is fn
    holder = torch.nn.Module()
    holder.fn = fn
    assert copy.deepcopy(holder).fn is fn


def test_given_setup_values_skip_their_lines_but_never_buffers() -> None:
    text = (
        "program f registers 2 statics 4\ninput r0 x float32 cpu [4] [1]\nconstant s0 w\n"
        "shared s1 negw\nshared s2 slot\nshared s3 view\nsetup:\n  s1 = neg.cpu s0\n"
        "  s2 = empty_strided [4] [1] torch.float32 device(cpu)\n  s3 = as_strided s2 [4] [1] 0\n"
        "body:\n  r1 = add.cpu r0 s1\n  _ = copy_.default s3 r1\n  return single r1\n"
    )
    given, slot = torch.full((4,), 5.0), torch.zeros(4)
    fn = _C.cpp_function(text, [torch.ones(4)], {"negw": given, "slot": slot, "view": slot}, None, PROCEED, None)
    x = torch.arange(4.0)
    torch.testing.assert_close(fn(x), x + 5)  # the given value, not -w
    assert torch.equal(slot, torch.zeros(4))  # the buffer the body writes is the program's own
    unshared = _C.cpp_function(text, [torch.ones(4)], {}, None, PROCEED, None)
    torch.testing.assert_close(unshared(x), x - 1)
    # a value setup writes in place afterwards stays the program's own: the given one had the write
    written = text.replace("  s2 = empty", "  _ = neg_.cpu s1\n  s2 = empty")
    fn = _C.cpp_function(written, [torch.ones(4)], {"negw": given}, None, PROCEED, None)
    torch.testing.assert_close(fn(x), x + 1)  # -(-w), computed by the program itself
    assert torch.equal(given, torch.full((4,), 5.0))


def program(body: str, inputs: str = HEADER) -> object:
    return _C.cpp_function(inputs + "setup:\nbody:\n" + body, [], {}, None, PROCEED, None)


def test_opaque_inputs_are_taken_and_never_read() -> None:
    """torch.compile passes each DTensor's spec beside its local tensor; the program never reads it."""
    header = "program f registers 3 statics 0\ninput r0 x float32 cpu [4] [1]\ninput r1 spec opaque\n"
    fn = program("  r2 = add.cpu r0 r0\n  return single r2\n", header)
    x = torch.randn(4)
    for spec in (object(), None, "spec", x):
        torch.testing.assert_close(fn(x, spec), x + x)  # type: ignore[operator]
    with pytest.raises(ValueError, match="input r<k> <name> int\\|opaque"):
        program("  return single r0\n", "program f registers 1 statics 0\ninput r0 x opaque extra\n")


class AddThree(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x + y * z


KEYWORD_CALLS = [
    ((0,), {"y": 1, "z": 2}),
    ((), {"z": 2, "x": 0, "y": 1}),
    ((0,), {"z": 2}),  # missing y
    ((0, 1), {"x": 0, "z": 2}),  # x twice
    ((0, 1), {"w": 2}),  # no input w
    ((0, 1, 2, 0), {}),
    ((), {}),
]


@pytest.mark.parametrize(("positional", "keywords"), KEYWORD_CALLS)
def test_calls_bind_arguments_as_python_does(positional: tuple[int, ...], keywords: dict[str, int]) -> None:
    """The default backend must take every call the generated Python takes, by keyword too, and say the same."""
    xs = [torch.randn(4), torch.randn(4), torch.randn(4)]
    python = opgen.compile(AddThree(), tuple(xs), backend="python")
    on_cpp = cpp(AddThree(), tuple(xs))
    args, kwargs = [xs[i] for i in positional], {k: xs[i] for k, i in keywords.items()}
    try:
        expected = python(*args, **kwargs)
    except TypeError as exc:
        message = str(exc).removeprefix("make.<locals>.")
        with pytest.raises(TypeError, match=re.escape(message)):
            on_cpp(*args, **kwargs)  # type: ignore[operator]
    else:
        torch.testing.assert_close(on_cpp(*args, **kwargs), expected)  # type: ignore[operator]


def test_the_signature_is_the_python_functions() -> None:
    import inspect

    xs = (torch.randn(4), torch.randn(4), torch.randn(4))
    assert inspect.signature(cpp(AddThree(), xs)) == inspect.signature(opgen.compile(AddThree(), xs, backend="python"))
    assert str(inspect.signature(cpp(AddThree(), xs))) == "(x, y, z)"


def test_keyword_arguments_go_through_the_input_check() -> None:
    xs = (torch.randn(4), torch.randn(4), torch.randn(4))
    fn = cpp(AddThree(), xs, automatic_dynamic=False)
    with pytest.raises(InputTypeError, match=r"input 'z' \(position 3\): expected dtype torch\.float32"):
        fn(*xs[:2], z=xs[2].double())  # type: ignore[operator]
    big = torch.randn(8)
    torch.testing.assert_close(fn(z=big, y=big, x=big), big + big * big)  # type: ignore[operator]


def test_single_add_prints_one_instruction_per_kernel_call() -> None:
    x, y = torch.randn(16), torch.randn(16)
    fn = cpp(Add(), (x, y), cache=False)
    assert type(fn).__name__ == "CppFunction"
    text = fn.artifact.cpp_program  # type: ignore[attr-defined]
    body = text.split("body:\n", 1)[1].splitlines()
    assert body == [
        "  guard r0 r1",
        "  r2 = add.cpu r0 r1  # add: aten.add.Tensor",
        "  recycle 0 _ = add_out.cpu r0 r1 _ r2  # add: aten.add.Tensor",  # into a dropped last result
        "  return single r2",
    ]
    assert "input r0 x float32 cpu [16] [1]" in text
    torch.testing.assert_close(fn(x, y), x + y)
    assert "backend: cpp" in str(fn.report())  # type: ignore[attr-defined]


class TwoOut(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x * y


def test_a_dropped_result_takes_the_next_value() -> None:
    """The next call writes into a result the caller let go of (no allocation), never one it can still see."""
    x, y = torch.randn(16), torch.randn(16)
    fn = cpp(Add(), (x, y))
    first = fn(x, y)
    address, identity = first.data_ptr(), id(first)
    del first
    again = fn(x, y)
    assert again.data_ptr() == address and id(again) == identity
    torch.testing.assert_close(again, x + y)
    kept = again
    fresh = fn(2 * x, y)  # `kept` is the caller's: a new result
    assert fresh.data_ptr() != kept.data_ptr()
    torch.testing.assert_close(kept, x + y)
    torch.testing.assert_close(fresh, 2 * x + y)


def _seen_by(result: torch.Tensor, how: str) -> object:
    """Something that still reaches `result` (or its memory) once the caller drops the name."""
    import weakref

    match how:
        case "view":
            return result[2:]
        case "numpy":
            return result.numpy()
        case "weakref":
            return weakref.ref(result)
        case "attribute":
            result.note = "mine"  # type: ignore[attr-defined]
            return None
        case "storage":
            return result.untyped_storage()
        case "requires_grad":
            result.requires_grad_(True)
            return None
        case "resized":
            result.resize_(4, 4)
            return None
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["view", "numpy", "weakref", "attribute", "storage", "requires_grad", "resized"])
def test_a_result_still_reachable_is_never_written(how: str) -> None:
    x, y = torch.randn(16), torch.randn(16)
    fn = cpp(Add(), (x, y))
    result = fn(x, y)
    address = result.data_ptr()
    keep = _seen_by(result, how)
    del result
    with torch.no_grad():
        after = fn(3 * x, y)
    torch.testing.assert_close(after, 3 * x + y)
    assert after.data_ptr() != address, how
    if how in ("view", "numpy"):
        torch.testing.assert_close(torch.as_tensor(keep), (x + y)[2:] if how == "view" else x + y)


def test_each_result_of_a_tuple_is_recycled_on_its_own() -> None:
    x, y = torch.randn(16), torch.randn(16)
    fn = cpp(TwoOut(), (x, y))
    assert re.findall(r"recycle (\d)", fn.artifact.cpp_program) == ["0", "1"]  # type: ignore[attr-defined]
    total, product = fn(x, y)
    kept, address = total, product.data_ptr()
    del total, product
    total, product = fn(x, y)
    assert product.data_ptr() == address and total.data_ptr() != kept.data_ptr()
    torch.testing.assert_close(total, x + y)
    torch.testing.assert_close(product, x * y)


RECYCLES = "program f registers 4 statics 0\n" + HEADER.split("\n", 1)[1] + "extern f\nsetup:\nbody:\n"
MAKES_R2 = "  r2 = add.cpu r0 r1\n  recycle 0 _ = add_out.cpu r0 r1 _ r2\n"


def test_an_error_after_writing_into_a_dropped_result_keeps_it_whole() -> None:
    """The program's register borrows the dropped result's tensor (no reference count change); a
    later line that raises gives it back, and the result is written into again next time."""
    fail = []

    def f(t: torch.Tensor) -> torch.Tensor:
        if fail:
            raise KeyError("from f")
        return t * 2

    body = MAKES_R2 + "  r3 = call f r2\n  return tuple r2 r3\n"
    fn = _C.cpp_function(RECYCLES + body, [], {"f": f}, None, PROCEED, None)
    x, y = torch.randn(16), torch.randn(16)
    total, doubled = fn(x, y)
    identity = id(total)
    del total, doubled
    fail.append(True)
    for _ in range(3):
        with pytest.raises(KeyError, match="from f"):
            fn(x, y)
    fail.clear()
    total, doubled = fn(2 * x, y)
    assert id(total) == identity
    torch.testing.assert_close(total, 2 * x + y)
    torch.testing.assert_close(doubled, 2 * (2 * x + y))
    del fn
    torch.testing.assert_close(total + 0, 2 * x + y)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  recycle 0 _ = add_out.cpu r0 r1 _ r2\n", "follows the body line that makes return value k"),
        ("  r2, r3 = max_dim.cpu r0 0\n  recycle 0 _ = add_out.cpu r0 r1 _ r2\n", "the one result of a kernel"),
        ("  r2 = add.cpu r0 r1\n  recycle 0 r3 = add_out.cpu r0 r1 _ r2\n", "a kernel call that makes nothing"),
        ("  r2 = add.cpu r0 r1\n  recycle 0 _ = add_out.cpu r0 r1 _ r3\n", "does not write into it"),
        (MAKES_R2 + "  free r2\n  return single r2\n", "a line after recycled r2 (r2 = add.cpu r0 r1) writes"),
        (MAKES_R2 + "  r2 = mul.cpu r0 r1\n  return single r2\n", "writes or frees it"),
        (MAKES_R2 + "  return single r0\n", "is not return value 0, once"),
        (MAKES_R2 + "  return tuple r2 r2\n", "is not return value 0, once"),
        (MAKES_R2 + "  return tuple r0 r2\n", "is not return value 0, once"),
    ],
)
def test_malformed_recycle_lines_raise_value_error(body: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        program(body)


def test_results_are_fresh_and_persistent_buffers_stay_inside() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    fn = cpp(model, (torch.randn(4, 32),))
    with torch.no_grad():
        first = fn(torch.randn(4, 32))
        kept = first.clone()
        second = fn(torch.randn(4, 32))
        x = torch.randn(4, 32)
        torch.testing.assert_close(fn(x), model(x))
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, kept)


def test_threads_share_persistent_buffers_safely() -> None:
    """Linear layers release the GIL (as their bindings do); calls sharing persistent buffers then take turns.
    (Without the `mkl_linear` pass, whose product has no out= variant, the first layer writes a buffer.)"""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    passes = [p for p in default_pipeline() if p != "mkl_linear"]
    fn = cpp(model, (torch.randn(4, 32),), passes=passes)
    assert "empty_strided" in fn.artifact.cpp_program.split("body:")[0]  # type: ignore[attr-defined]
    inputs = [torch.randn(4, 32) for _ in range(4)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    wrong: list[int] = []

    def work(i: int) -> None:
        with torch.no_grad():
            for _ in range(200):
                if not torch.allclose(fn(inputs[i]), expected[i], atol=1e-5):
                    wrong.append(i)
                    return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_new_shapes_respecialize_and_bad_inputs_raise_as_on_python() -> None:
    x, y = torch.randn(16), torch.randn(16)
    fn = cpp(Add(), (x, y), automatic_dynamic=False)
    a, b = torch.randn(32), torch.randn(32)
    torch.testing.assert_close(fn(a, b), a + b)  # a new specialization, compiled by the slow path
    with pytest.raises(InputTypeError, match=r"expected dtype torch\.float32"):
        fn(x.double(), y.double())
    with pytest.raises(InputMismatchError, match="expected a 1-d tensor"):
        fn(a.view(4, 8), b.view(4, 8))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'y'"):  # as Python says it
        fn(x)
    with pytest.raises(TypeError):
        fn(x, "y")


def test_grad_mode_guard_as_on_python() -> None:
    model = torch.nn.Linear(4, 4)  # parameters require grad
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(2, 4),), backend="cpp")
    assert type(fn).__name__ == "CppFunction"
    with pytest.raises(RequiresGradError):
        fn(torch.randn(2, 4))  # grad mode on: the guard refuses, the slow path raises
    with torch.no_grad():
        x = torch.randn(2, 4)
        torch.testing.assert_close(fn(x), model(x))


def _unsupported(*args: object, **kwargs: object) -> object:
    raise cpp_backend.CppUnsupported("a list of dtypes as an argument of py:f")


def test_unsupported_graph_stays_python_with_one_warning_and_a_report_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the backend cannot print (a list of dtypes for a Python function in the graph) keeps the Python function."""

    monkeypatch.setattr(cpp_backend, "emit", _unsupported)
    x = torch.randn(8, 4)
    with torch.no_grad(), pytest.warns(OpgenWarning, match="not supported by the cpp backend yet") as record:
        fn = opgen.compile(Dynamic(), (x,), backend="cpp", cache=False)
    assert len([w for w in record if issubclass(w.category, OpgenWarning)]) == 1
    assert type(fn).__name__ == "function"
    assert "backend: python ('cpp' asked; not supported by the cpp backend yet: a list of dtypes" in str(fn.report())  # type: ignore[attr-defined]
    torch.testing.assert_close(fn(x), Dynamic()(x))


def test_dynamic_shapes_bind_sizes_in_the_program() -> None:
    x = torch.randn(8, 4)
    dims = {"x": {0: torch.export.Dim("n", min=2, max=64)}}
    fn = cpp(Dynamic(), (x,), dynamic_shapes=dims, cache=False)
    program = fn.artifact.cpp_program  # type: ignore[attr-defined]
    assert "input r0 x float32 cpu [?,4] [4,1]" in program
    assert re.search(r"r\d+ = size r0 0  # s\d+ = x.shape\[0\]", program)
    for n in (2, 7, 64, 8):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fn(x), Dynamic()(x))
    with pytest.raises(InputMismatchError, match="range"):
        fn(torch.randn(65, 4))


SIZE_TEXTS = ["s0*64 + 1", "(s0 - 7)//3", "(7 - s0) % 3", "-s0 % -4", "max(s0, 5, 2*s0 - 20) - min(s0, 3)", "s0**2"]


@pytest.mark.parametrize("text", SIZE_TEXTS)
def test_size_arithmetic_is_pythons(text: str) -> None:
    """`sym` lines: the IR's size expressions in postfix (codegen.cpp_sizes), Python's // and % included."""
    from opgen.runtime.codegen.cpp_sizes import postfix

    program = " ".join(postfix(text, lambda name: "r1"))
    head = "program f registers 3 statics 0\ninput r0 x float32 cpu [?] [1]\nsetup:\nbody:\n  guard r0\n"
    body = f"  r1 = size r0 0\n  r2 = sym {program}\n  return single r2\n"
    fn = _C.cpp_function(head + body, [], {}, None, PROCEED, None, None, lambda x: True)
    for n in (0, 1, 5, 12, 40):
        assert fn(torch.empty(n)) == eval(text, {"s0": n}), (text, n)  # the test's own text
    with pytest.raises(ValueError, match="needs its input check"):
        _C.cpp_function(head + body, [], {}, None, PROCEED, None)


def test_a_profile_shows_each_kernel_by_node_as_on_python() -> None:
    """While a profiler is on, the executor runs the call in the graph's range and each kernel call in
    its node's, the ranges of the Python backend's profiled twin."""
    x, y = torch.randn(16), torch.randn(16)
    fns = {backend: opgen.compile(Add(), (x, y), backend=backend, cache=False) for backend in ("python", "cpp")}
    assert type(fns["cpp"]).__name__ == "CppFunction"
    names = {}
    for backend, fn in fns.items():
        fn(x, y)
        with torch.profiler.profile() as prof:
            torch.testing.assert_close(fn(x, y), x + y)
        names[backend] = {e.name for e in prof.events() if e.name.startswith("opgen::")}
    assert "opgen::add (aten.add.Tensor)" in names["cpp"]
    assert any(n.startswith("opgen::forward (Add, graph ") for n in names["cpp"]), names
    assert {n.split(", graph")[0] for n in names["cpp"]} == {n.split(", graph")[0] for n in names["python"]}


def test_auto_picks_cpp_where_it_can_and_python_silently_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = torch.randn(16), torch.randn(16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)
        fast = opgen.compile(Add(), (x, y), backend="auto", cache=False)
        monkeypatch.setattr(cpp_backend, "emit", _unsupported)
        slow = opgen.compile(Add(), (x, y), backend="auto", cache=False)
    assert type(fast).__name__ == "CppFunction" and type(slow).__name__ == "function"


def test_bad_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="backend must be one of 'python', 'cpp', 'auto'"):
        opgen.compile(Add(), (torch.randn(2), torch.randn(2)), backend="c++")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="backend must be one of"):
        torch.compile(Add(), backend="opgen", options={"backend": "rust"})(torch.randn(2), torch.randn(2))


def test_torch_compile_backend_option_runs_cpp() -> None:
    torch._dynamo.reset()
    x, y = torch.randn(16), torch.randn(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)
        compiled = torch.compile(Add(), backend="opgen", options={"backend": "cpp"})
        torch.testing.assert_close(compiled(x, y), x + y)


def test_debug_prints_the_program(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPGEN_DEBUG", "1")
    cpp(Add(), (torch.randn(16), torch.randn(16)), cache=False)
    err = capsys.readouterr().err
    assert "C++ executor program" in err and "r2 = add.cpu r0 r1  # add: aten.add.Tensor" in err


class Fallbacks(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values, indices = torch.cummax(x, dim=1)  # no kernel_ops function: ATen ops through the dispatcher
        return torch.roll(values, shifts=1, dims=0) + 1, indices, torch.kthvalue(x, 2, dim=1).values


def test_aten_fallbacks_run_through_the_dispatcher() -> None:
    x = torch.randn(4, 6)
    fn = cpp(Fallbacks(), (x,), fallback=True)
    text = fn.artifact.cpp_program  # type: ignore[attr-defined]
    assert "= op aten::cummax.default r0 1  # cummax: aten.cummax.default" in text
    got, want = fn(x), Fallbacks()(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_literals_lists_and_defaults() -> None:
    x, y = torch.randn(16), torch.randn(16)
    fn = program(
        "  r2 = add.cpu r0 r1 2.5\n"  # alpha given
        "  r3 = view.cpu r2 [4,4]\n"
        "  r4 = list r3 r3\n"
        "  r5 = cat.cpu r4 1\n"
        "  return tuple r5 None 3 True\n",
        HEADER.replace("registers 4", "registers 6"),
    )
    out, none, three, true = fn(x, y)
    expected = torch.cat([(x + 2.5 * y).view(4, 4)] * 2, 1)
    torch.testing.assert_close(out, expected)
    assert none is None and three == 3 and true is True


def _to_dtype(x: torch.Tensor, dtype: torch.dtype, *, layout: torch.layout, fmt: torch.memory_format) -> torch.Tensor:
    assert (type(dtype), layout, fmt) == (torch.dtype, torch.strided, torch.contiguous_format)
    return x.to(dtype)


def test_an_extern_gets_dtypes_layouts_and_memory_formats_as_torch_objects() -> None:
    """As the Python function passes them (a register holds only their numbers)."""
    meta = TensorMeta((4,), (1,), "float32", "cpu")
    out = Value("y", TensorMeta((4,), (1,), "float64", "cpu"))
    call = KernelCall(
        "py:tests.to_dtype", (Ref("x"), Sym("dtype", "float64")),
        (("layout", Sym("layout", "strided")), ("fmt", Sym("memory_format", "contiguous_format"))),
        (out,), "to", "tests.to_dtype", fallback=True,
    )  # fmt: skip
    ir = Program("forward", (Input("x", meta),), (), (), (call, Return((Ref("y"),), "single")))
    text = cpp_backend.emit(ir, default_registry()).text
    assert "call op_tests_to_dtype r0 torch.float64 layout=layout(strided) fmt=memory_format(contiguous_format)" in text
    fn = _C.cpp_function(text, [], {"op_tests_to_dtype": _to_dtype}, None, PROCEED, None)
    x = torch.randn(4)
    torch.testing.assert_close(fn(x), x.double())
    listed = replace(call, args=(Ref("x"), (Sym("dtype", "float64"),)), kwargs=())
    with pytest.raises(cpp_backend.CppUnsupported, match="a list of dtypes as an argument of op_tests_to_dtype"):
        cpp_backend.emit(replace(ir, body=(listed, ir.body[1])), default_registry())


def test_boxed_operator_calls_through_the_dispatcher() -> None:
    x = torch.randn(16)
    text = "program f registers 4 statics 0\ninput r0 x float32 cpu [16] [1]\nsetup:\nbody:\n"
    body = "  r1, r2 = op aten::sort.default r0 descending=True\n  return tuple r1 r2\n"
    fn = _C.cpp_function(text + body, [], {}, None, PROCEED, None)
    values, indices = fn(x)
    ref = torch.sort(x, descending=True)
    torch.testing.assert_close(values, ref.values)
    torch.testing.assert_close(indices, ref.indices)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  r2 = nosuchop.cpu r0 r1\n", "line 6: no thunk for nosuchop on cpu"),
        ("  r2 = add.cpu r0 r9\n", "line 6: index out of range: r9"),
        ("  r2 add.cpu r0 r1\n", "line 6: expected `<outputs> = <what> <operands...>`"),
        ("  r2 = op aten::nosuch r0\n", "line 6: no operator aten::nosuch"),
        ("  r2 = add.cpu r0 torch.float99\n", "line 6: unknown dtype torch.float99"),
    ],
)
def test_malformed_programs_raise_value_error_naming_the_line(body: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        program(body)


def test_kernel_errors_keep_their_type_and_name_the_instruction() -> None:
    x = torch.randn(4, 4)
    text = "program f registers 2 statics 0\ninput r0 x float32 cpu [4,4] [4,1]\nsetup:\nbody:\n"
    fn = _C.cpp_function(text + "  r1 = view.cpu r0 [5,5]  # view_1: aten.view.default\n  return single r1\n",
                         [], {}, None, PROCEED, None)  # fmt: skip
    with pytest.raises(RuntimeError, match=r"opgen program f: .*view_1"):
        fn(x)
    with pytest.raises(RuntimeError):  # the function stays usable after an error, and raises again
        fn(x)


def test_constants_must_be_tensors() -> None:
    text = "program f registers 1 statics 1\ninput r0 x float32 cpu [2] [1]\nconstant s0 w\nsetup:\nbody:\n"
    with pytest.raises(TypeError, match="constants must be tensors"):
        _C.cpp_function(text + "  return single s0\n", [3], {}, None, PROCEED, None)
    fn = _C.cpp_function(text + "  r0 = mul.cpu r0 s0\n", [torch.full((2,), 3.0)], {}, None, PROCEED, None)
    assert fn is not None


EXTERNS = "program f registers 4 statics 0\ninput r0 x float32 cpu [4] [1]\nextern f\nextern g\nsetup:\nbody:\n"


def test_extern_calls_pass_operands_and_take_results_as_python_does() -> None:
    seen = []

    def f(x: torch.Tensor, scale: float, *, name: str) -> tuple[torch.Tensor, object]:
        seen.append((scale, name))
        return x * scale, {"work": 1}  # a tuple, unpacked; a Python object held in a register

    def g(x: torch.Tensor, work: object) -> torch.Tensor:
        assert work == {"work": 1}
        return x + 1

    body = "  r1, r2 = call f r0 2.0 name='a%20b'\n  r3 = call g r1 r2\n  free r2\n  return single r3\n"
    fn = _C.cpp_function(EXTERNS + body, [], {"f": f, "g": g}, None, PROCEED, None)
    x = torch.randn(4)
    torch.testing.assert_close(fn(x), x * 2 + 1)
    assert seen == [(2.0, "a b")]


def test_extern_errors() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        raise KeyError("from f")

    fn = _C.cpp_function(EXTERNS + "  r1 = call f r0\n  return single r1\n", [], {"f": f, "g": f}, None, PROCEED, None)
    with pytest.raises(KeyError, match="from f"):  # the extern's own exception, as it raised it
        fn(torch.randn(4))
    with pytest.raises(ValueError, match="no function for the program's extern g"):
        _C.cpp_function(EXTERNS + "  return single r0\n", [], {"f": f}, None, PROCEED, None)
    with pytest.raises(ValueError, match=re.escape("line 7: call of h, which no `extern` line names")):
        _C.cpp_function(EXTERNS + "  r1 = call h r0\n", [], {"f": f, "g": f}, None, PROCEED, None)


CHOICE = """program f registers 3 statics 0
input r0 x float32 cpu [4] [1]
extern f
setup:
body:
  r1 = call f r0
  return single r1
alternative f square
  r1 = mul.cpu r0 r0
alternative f cube
  r2 = mul.cpu r0 r0
  r1 = mul.cpu r2 r0
  free r2
"""


def test_a_resolved_choice_runs_its_picked_lines_in_place_of_the_call() -> None:
    calls, asked = [], []

    def f(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x * x

    def resolver() -> dict[str, str] | None:
        asked.append(True)
        return None if len(asked) < 2 else {"f": "cube"}  # not settled after the first call

    fn = _C.cpp_function(CHOICE, [], {"f": f}, None, PROCEED, None, resolver)
    x = torch.randn(4)
    torch.testing.assert_close(fn(x), x * x)
    assert fn.picks is None
    torch.testing.assert_close(fn(x), x * x)
    assert fn.picks == {"f": "cube"}
    torch.testing.assert_close(fn(x), x * x * x)  # the picked lines, not the call
    assert len(calls) == 2 and len(asked) == 2
    bad = _C.cpp_function(CHOICE, [], {"f": f}, None, PROCEED, None, lambda: {"f": "nope"})
    with pytest.raises(ValueError, match="f has no alternative nope"):
        bad(x)


def test_thunk_emitter_calls_what_the_binding_calls() -> None:
    ops = {s.python_name: s for s in load_spec(ROOT / "ops.yaml")}
    add = ops["add"]
    kernel = next(k for k in add.kernels if k.backend == "cpu")
    text = thunks.emit_thunk(add, kernel)
    assert "void thunk_add_cpu(opgen::exec::Frame& f, const opgen::exec::Instr& in) {" in text
    assert "const at::Tensor& self = f.tensor(in, 0);" in text
    assert "const at::Scalar alpha = f.has(in, 2) ? f.arg<at::Scalar>(in, 2) : at::Scalar(int64_t(1));" in text
    assert "f.result(in, at::cpu::add(self, other, alpha));" in text
    inplace = ops["add_"]
    text = thunks.emit_thunk(inplace, next(k for k in inplace.kernels if k.backend == "cpu"))
    assert "at::Tensor& self = f.mutable_tensor(in, 0);" in text
    cuda = next(k for k in add.kernels if k.backend == "cuda")
    assert thunks.emit_thunk(add, cuda).startswith("#ifdef OPGEN_WITH_CUDA\n")
    assert thunks.table_entry(add, kernel) == '    {"add", "cpu", thunk_add_cpu, false},'
