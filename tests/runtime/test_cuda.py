"""The runtime on CUDA: every runtime graph in plain and CUDA-graph mode, through both entry points,
plus what graph mode promises (fresh or static outputs, static inputs, streams, devices, fallbacks).

Skipped without a GPU. cuDNN's TF32 is off here: with it on (torch's default), folding batch norm
into the convolution weights changes ResNet-18's logits by about 1e-2 (by about 1e-5 with it off).
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from runtime_cases import CASES, GraphCase
from test_correctness import assert_same
from torch import nn

import opgen
from opgen.bench import graph_notes
from opgen.runtime.errors import OpgenWarning
from opgen.runtime.passes import DEFAULT_PIPELINE, JIT_PASSES

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("cudnn_exact"),
]

# Cases whose models make CPU tensors in forward (a CPU tensor times a CUDA one fails in eager too).
CPU_ONLY = {"constants"}
CUDA_CASES = [c for c in CASES if c.name not in CPU_ONLY]


def _cuda_inputs(case: GraphCase, device: str) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device) for t in case.inputs())


def run_calls(case: GraphCase, compile_fn: Callable[..., Any], device: str = "cuda", calls: int = 4) -> Any:
    """Compile on copies, call with new values each time (copies into static buffers must follow)."""
    model = case.model().to(device)
    eager_model = copy.deepcopy(model)
    with torch.no_grad():
        compiled = compile_fn(model, _cuda_inputs(case, device))
        for _ in range(calls):
            args = _cuda_inputs(case, device)
            eager_args = tuple(a.clone() for a in args)
            out = compiled(*args)
            ref = eager_model(*eager_args)
            assert_same(out, ref, case.atol)
            if case.mutates:
                assert_same(args, eager_args, case.atol)
                assert_same(list(model.buffers()), list(eager_model.buffers()), case.atol)
    torch.cuda.synchronize()
    return compiled


@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.name for c in CUDA_CASES])
def test_plain_on_cuda(case: GraphCase) -> None:
    run_calls(case, lambda m, x: opgen.compile(m, x))


@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.name for c in CUDA_CASES])
def test_graph_mode_on_cuda(case: GraphCase) -> None:
    compiled = run_calls(case, lambda m, x: opgen.compile(m, x, cuda_graphs=True))
    assert compiled.graph_status.captured, compiled.report()
    assert "CUDA graph: captured" in str(compiled.report())


@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.name for c in CUDA_CASES])
def test_graph_mode_static_outputs_on_cuda(case: GraphCase) -> None:
    run_calls(case, lambda m, x: opgen.compile(m, x, cuda_graphs=True, static_outputs=True))


@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.name for c in CUDA_CASES])
def test_backend_graph_mode_on_cuda(case: GraphCase) -> None:
    torch._dynamo.reset()
    options = {"cuda_graphs": True}
    run_calls(case, lambda m, x: torch.compile(m, backend="opgen", dynamic=False, options=options))


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).cuda().eval()
    return model, torch.randn(4, 32, device="cuda")


def test_fresh_outputs_survive_later_calls() -> None:
    model, x = _mlp()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        fn(x)  # capture
        first = fn(x)
        kept = first.clone()
        second = fn(torch.randn_like(x))
        torch.testing.assert_close(first, kept)
        assert first.data_ptr() != second.data_ptr()


def test_a_size_one_dimension_may_have_any_stride() -> None:
    """A [1, 32] row sliced from a wider tensor (strides (64, 1)) is as a fresh one: it replays, no recompile."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).cuda().eval()
    wide = torch.randn(1, 64, device="cuda")
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(1, 32, device="cuda"),), cuda_graphs=True, recompile=False)
        fn(torch.randn(1, 32, device="cuda"))  # capture
        row = wide[:, :32]
        assert row.stride() == (64, 1)
        torch.testing.assert_close(fn(row), model(row))
        status = fn.graph_status  # type: ignore[attr-defined]
    assert status.calls() == (1, 0), status.line()
    assert "(1 replays)" in status.line()


def test_calls_that_do_not_fit_the_capture_are_counted_in_the_report() -> None:
    """Inputs of other strides run plain (another specialization); report() counts them beside the replays."""
    model, x = _mlp()
    transposed = torch.randn(32, 4, device="cuda").t()  # [4, 32] with strides (1, 4)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        fn(x)  # capture
        fn(x)
        torch.testing.assert_close(fn(transposed), model(transposed))
        status = fn.graph_status  # type: ignore[attr-defined]
    assert status.calls() == (1, 1)
    assert "(1 replays; 1 calls ran plain: inputs unlike the capture's" in str(fn.report())  # type: ignore[attr-defined]


def test_a_graph_mode_function_copies_as_itself() -> None:
    import copy

    model, x = _mlp()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
    assert type(fn).__name__ == "GraphRunner"
    assert copy.copy(fn) is fn and copy.deepcopy(fn) is fn


def test_a_graph_mode_function_takes_keyword_arguments() -> None:
    """They run the plain function (the graph replays positional calls), before and after capture."""
    import inspect

    model, x = _mlp()
    with torch.no_grad():
        (name,) = inspect.signature(opgen.compile(model, (x,))).parameters  # the plain function's
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        expected = model(x)
        torch.testing.assert_close(fn(**{name: x}), expected)  # type: ignore[operator]
        fn(x)  # capture
        assert fn.graph_status.captured  # type: ignore[attr-defined]
        torch.testing.assert_close(fn(**{name: x}), expected)  # type: ignore[operator]


def test_a_dropped_result_is_recycled_but_never_one_still_seen() -> None:
    """A fresh result the caller dropped may back the next result; one it kept, or viewed, never does."""
    model, x = _mlp()
    y = torch.randn_like(x)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        fn(x)
        view = fn(x).view(-1)  # the result itself is dropped, its storage is not
        expected = model(x).view(-1)
        for _ in range(3):
            torch.testing.assert_close(fn(y), model(y))
        torch.testing.assert_close(view, expected)


def test_a_weakly_referenced_result_is_never_recycled() -> None:
    """Python 3.12+ keeps a torch.Tensor's weak references before the object (a negative offset)."""
    import weakref

    model, x = _mlp()
    y = torch.randn_like(x)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        fn(x)
        ref = weakref.ref(fn(x))
        expected = model(x)
        for _ in range(3):
            torch.testing.assert_close(fn(y), model(y))
        if ref() is not None:  # still alive: kept by the runner, and never written
            torch.testing.assert_close(ref(), expected)


def test_static_outputs_are_overwritten_by_the_next_call() -> None:
    """The opt-in: no copy, the same buffer every call, so a result kept across calls changes."""
    model, x = _mlp()
    y = torch.randn_like(x)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True, static_outputs=True)
        fn(x)  # capture
        first = fn(x)
        expected_first = model(x)
        second = fn(y)
        assert first.data_ptr() == second.data_ptr()
        torch.testing.assert_close(first, model(y))  # the old result now holds the new values
        assert not torch.allclose(first, expected_first)
        kept = fn(x).clone()  # what a caller who keeps a result does
        fn(y)
        torch.testing.assert_close(kept, expected_first)


def test_static_inputs_skip_the_copy() -> None:
    """Passing the static input buffer itself skips its copy; another tensor is copied into it."""
    model, x = _mlp()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        fn(x)
        (static,) = fn.static_inputs
        static.copy_(x)
        torch.testing.assert_close(fn(static), model(x))
        torch.testing.assert_close(fn(x * 2), model(x * 2))
        torch.testing.assert_close(static, x * 2)  # the call copied its input into the buffer
        static.copy_(x + 1)
        torch.testing.assert_close(fn(static), model(x + 1))


def test_runs_on_the_callers_stream() -> None:
    model, x = _mlp()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    with torch.no_grad():
        for graphs in (False, True):
            fn = opgen.compile(model, (x,), cuda_graphs=graphs)
            results = []
            for i in range(6):
                stream = streams[i % 2]
                inp = torch.full_like(x, float(i))
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    results.append((fn(inp), inp))
                    torch.cuda._sleep(1_000_000)  # keep the stream busy, so an unordered switch would race
            torch.cuda.synchronize()
            for out, inp in results:
                torch.testing.assert_close(out, model(inp))


def test_new_shapes_capture_their_own_graph() -> None:
    model, x = _mlp()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        for rows in (4, 7, 4, 7, 1):
            inp = torch.randn(rows, 32, device="cuda")
            torch.testing.assert_close(fn(inp), model(inp))
        assert "specializations for input shapes so far: 3" in str(fn.report())


def test_wrong_input_is_still_a_clear_error() -> None:
    model, x = _mlp()
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)
        fn(x)
        fn(x)
        with pytest.raises(opgen.InputTypeError, match=r"expected dtype torch\.float32"):
            fn(x.double())
        with pytest.raises(opgen.InputMismatchError, match="expected a tensor on cuda"):
            fn(x.cpu())


class _CopiesCpuInput(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.to(x.device)


def test_a_cpu_input_runs_plain_with_a_warning() -> None:
    """A CPU input (copied to the GPU in the graph) cannot be captured: a graph would replay the value it read
    at capture. The compile says so once, and every call runs the plain function with the caller's value."""
    x, y = torch.randn(8, device="cuda"), torch.randn(8)
    with torch.no_grad():
        cpu_input = "CUDA graphs not used for _CopiesCpuInput: input .* is a CPU tensor"
        with pytest.warns(opgen.OpgenWarning, match=cpu_input):
            fn = opgen.compile(_CopiesCpuInput(), (x, y), cuda_graphs=True)
        torch.testing.assert_close(fn(x, y), x + y.cuda())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once
            for _ in range(3):
                y = torch.randn(8)
                torch.testing.assert_close(fn(x, y), x + y.cuda())
    assert not fn.graph_status.captured
    assert "CUDA graph: not used" in str(fn.report())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("graphs", [False, True])
def test_second_device(graphs: bool) -> None:
    torch.cuda.set_device(0)
    case = next(c for c in CASES if c.name == "resnet18_small")
    compiled = run_calls(case, lambda m, x: opgen.compile(m, x, cuda_graphs=graphs), device="cuda:1")
    assert compiled.graph_status.captured if graphs else True


def test_first_calls_from_several_threads_capture_once() -> None:
    import threading

    model, x = _mlp()
    inputs = [torch.randn_like(x) for _ in range(4)]
    results: list[Any] = [None] * 4
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cuda_graphs=True)

        def call(i: int) -> None:
            with torch.no_grad():
                results[i] = [fn(inputs[i]) for _ in range(3)]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        torch.cuda.synchronize()
        for i in range(4):
            for out in results[i]:
                torch.testing.assert_close(out, model(inputs[i]))
    assert fn.graph_status.captured


@pytest.mark.parametrize("graphs", [False, True], ids=["plain", "cuda_graphs"])
@pytest.mark.parametrize("name", ["mlp_batch", "attention_seq", "decoder_both"])
def test_dynamic_shapes_on_cuda(name: str, graphs: bool) -> None:
    """One dynamic compile serves the range on the GPU; with CUDA graphs asked for, it captures one graph
    a set of sizes on the second call at them and replays it from the third (`execution.size_graphs`)."""
    from test_dynamic import CASES as DYNAMIC

    factory, make, shapes, sizes, example = DYNAMIC[name]
    torch.manual_seed(0)
    model = factory().eval().cuda()

    def make_cuda(*size: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.cuda() for t in make(*size))

    with torch.no_grad():
        example_args = make_cuda(*example) if isinstance(example, tuple) else make_cuda(example)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn = opgen.compile(model, example_args, dynamic_shapes=shapes, cache=False, cuda_graphs=graphs)
        said = [str(w.message) for w in caught if issubclass(w.category, opgen.OpgenWarning)]
        assert not any("CUDA graphs not used" in m for m in said), said
        for size in [*sizes, *sizes, *sizes]:
            args = make_cuda(*size) if isinstance(size, tuple) else make_cuda(size)
            torch.testing.assert_close(fn(*args), model(*args), rtol=1e-4, atol=1e-4)
    assert fn.report().specializations == 1, "a size inside the range compiled again"
    if graphs:
        line = fn.report().cuda_graph  # (of one size class where the range is split in several)
        found = re.search(r"one graph a set of sizes: (\d+) captured .*\((\d+) replays", line)
        assert found and 1 <= int(found[1]) <= len(sizes) and int(found[2]) >= int(found[1]), line


def test_automatic_dynamic_shapes_under_torch_compile_replay_per_size() -> None:
    """torch.compile marks a size dynamic when it sees a second one (transformers' generate() with a longer
    cache): that graph captures a CUDA graph a size, as Inductor's cudagraph trees record one."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).cuda().eval()
    fn = torch.compile(model, backend="opgen", options={"cuda_graphs": True})
    with torch.no_grad(), warnings.catch_warnings(), graph_notes.collecting() as made:
        warnings.simplefilter("error", OpgenWarning)
        for rows in (3, 5, 9, 5, 9, 5, 9, 5, 9):  # 5 and 9: run plain, captured, then replayed twice
            x = torch.randn(rows, 16, device="cuda")
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(made) == 2, "one static graph, then one dynamic"
    line = made[1].report().cuda_graph
    assert "one graph a set of sizes: 2 captured" in line and "(4 replays; calls that ran plain: 2 first" in line, line
    assert graph_notes.note(made).endswith("graph 1: 2 sizes captured, 4 replays, plain: 2 first calls at new sizes")


NO_JIT = tuple(p for p in DEFAULT_PIPELINE if p not in JIT_PASSES)


@pytest.mark.parametrize("passes", [DEFAULT_PIPELINE, NO_JIT], ids=["triton", "no_triton"])
@pytest.mark.parametrize("graphs", [False, True], ids=["plain", "cuda_graphs"])
@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.name for c in CUDA_CASES])
def test_cpp_backend_on_cuda(case: GraphCase, graphs: bool, passes: tuple[str, ...]) -> None:
    """The C++ executor runs every runtime graph on CUDA through its CUDA thunks, plain and captured in
    CUDA graphs (the capture wraps either backend's function), with the Triton passes (fused kernels,
    their choices and Triton launchers are the program's externs) and without them."""

    def compile_cpp(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("error", OpgenWarning)  # the program must run on the executor
            return opgen.compile(model, inputs, backend="cpp", passes=passes, cuda_graphs=graphs)

    compiled = run_calls(case, compile_cpp)
    assert "backend: cpp" in " ".join(compiled.report().notes)
    fused = re.findall(r"^alternative (\S+) triton$", compiled.artifact.cpp_program, re.M)
    if not graphs:  # each fused kernel settled on its first call, and runs from C++ since
        assert sorted(compiled.picks or {}) == sorted(fused), compiled.report()
