"""CUDA-graph mode where no GPU is needed: options, the CPU fallback, how outputs are planned, and which
calls count as random (their graphs replay through torch's generator prologue)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.bench import models
from opgen.runtime.artifact.compiled import DROPOUT_P, DROPOUT_TRAIN, CompiledGraph, random_calls
from opgen.runtime.execution.cuda_graphs import CaptureRefused, CudaGraphs, GraphStatus
from opgen.runtime.execution.graph_outputs import output_plans
from opgen.runtime.ir import Arg, Input, KernelCall, Program, Ref, Return, TensorMeta, Value


def test_graph_mode_on_a_cpu_model_runs_plain_and_says_why() -> None:
    x, y = torch.randn(16), torch.randn(16)
    with torch.no_grad():
        with pytest.warns(
            opgen.OpgenWarning, match=r"CUDA graphs not used for SingleAdd: the graph has no CUDA tensors"
        ):
            fn = opgen.compile(models.SingleAdd(), (x, y), cuda_graphs=True, cache=False)
        torch.testing.assert_close(fn(x, y), x + y)
    assert not fn.graph_status.captured
    assert "CUDA graph: not used, running the plain generated code: the graph has no CUDA tensors" in str(fn.report())


def test_static_outputs_needs_graph_mode() -> None:
    with pytest.raises(ValueError, match="static_outputs=True needs cuda_graphs=True"):
        opgen.compile(models.SingleAdd(), (torch.randn(2), torch.randn(2)), static_outputs=True)


def test_backend_lists_the_graph_options() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(models.SingleAdd(), backend="opgen", options={"cuda_graph": True})
    with pytest.raises(Exception, match=r"unknown options \['cuda_graph'\].*cuda_graphs, static_outputs"):
        compiled(torch.randn(2), torch.randn(2))


def test_output_plans() -> None:
    """Inputs' views are rebuilt on the caller's tensor, pool outputs copied, views of them re-viewed."""
    static = torch.zeros(3, 4)
    pooled = torch.zeros(2, 6)
    other = torch.zeros(5)
    constant = torch.ones(2)
    ranges = [(pooled.untyped_storage().data_ptr(), pooled.untyped_storage().data_ptr() + 48),
              (other.untyped_storage().data_ptr(), other.untyped_storage().data_ptr() + 20)]  # fmt: skip
    leaves = [static.t(), pooled, pooled[1], other, constant, None]
    plans = output_plans(leaves, [static], frozenset(), ranges, static_outputs=False)
    assert plans[0] == ("input_view", 0, (4, 3), (1, 4), 0)
    assert plans[1] == ("fresh", pooled)
    assert plans[2] == ("fresh_view", 1, (6,), (1,), 6)
    assert plans[3] == ("fresh", other)
    assert plans[4] == ("object", constant) and plans[5] == ("object", None)
    static_plans = output_plans(leaves, [static], frozenset(), ranges, static_outputs=True)
    assert [p[0] for p in static_plans] == ["input_view", "object", "object", "object", "object", "object"]
    fixed = output_plans([static.t()], [static], frozenset({0}), ranges, static_outputs=False)
    assert [p[0] for p in fixed] == ["object"]  # a view of a parameter: it stays where it is


def test_output_plans_refuse_what_copies_cannot_reproduce() -> None:
    pooled = torch.zeros(4, 4)
    start = pooled.untyped_storage().data_ptr()
    overlapping = [pooled[:, :2], pooled[:, 1:]]  # neither is dense, neither covers the other
    with pytest.raises(CaptureRefused, match="share memory"):
        output_plans(overlapping, [], frozenset(), [(start, start + 64)], static_outputs=False)
    static = torch.zeros(4)
    with pytest.raises(CaptureRefused, match="another dtype"):
        output_plans([static.view(torch.int32)], [static], frozenset(), [], static_outputs=False)


META = TensorMeta((2, 4, 8, 16), (512, 128, 16, 1), "float32", "cuda:0")


def _call(
    target: str, args: tuple[Arg, ...], kwargs: tuple[tuple[str, Arg], ...] = (), seeded: bool = True
) -> KernelCall:
    return KernelCall(target, args, kwargs, (Value("out", META),), "node", target, fallback=True, seeded=seeded)


def _random(*calls: KernelCall) -> tuple[tuple[str, str], ...]:
    inputs = tuple(Input(n, META) for n in ("q", "k", "v"))
    return random_calls(Program("forward", inputs, (), (), (*calls, Return((Ref("out"),)))))


QKV = (Ref("q"), Ref("k"), Ref("v"))
SDPA = "aten.scaled_dot_product_attention.default"


@pytest.mark.parametrize(
    ("target", "args", "kwargs"),
    [
        (SDPA, QKV, ()),  # dropout_p left out: its default, 0.0
        (SDPA, (*QKV, None, 0.0), ()),
        (SDPA, (*QKV, None, 0), ()),
        (SDPA, QKV, (("dropout_p", 0.0), ("is_causal", True))),
        ("aten._scaled_dot_product_flash_attention.default", (*QKV, 0.0, True), ()),
        ("aten._scaled_dot_product_efficient_attention.default", (*QKV, None, False, 0.0, True), ()),
        ("aten._scaled_dot_product_cudnn_attention.default", (*QKV, None, False), ()),
        ("aten._scaled_dot_product_flash_attention_for_cpu.default", (*QKV, 0.0), ()),
        ("aten._efficient_attention_forward.default", (*QKV, None, None, None, None, None, 0.0, 0), ()),
        ("aten._flash_attention_forward.default", (*QKV, None, None, 8, 8, 0.0, True, False), ()),
        ("aten.native_dropout.default", (Ref("q"), 0.5, False), ()),
        ("aten.dropout.default", (Ref("q"), 0.5), (("train", False),)),
    ],
)
def test_calls_whose_constant_arguments_draw_nothing_are_not_random(target: str, args: tuple, kwargs: tuple) -> None:
    assert _random(_call(target, args, kwargs)) == ()


@pytest.mark.parametrize(
    ("target", "args", "kwargs"),
    [
        (SDPA, (*QKV, None, 0.1), ()),
        (SDPA, QKV, (("dropout_p", 0.5),)),
        (SDPA, (*QKV, None, Ref("p")), ()),  # not a constant: assumed to draw
        ("aten._scaled_dot_product_flash_attention.default", (*QKV, 0.2), ()),
        ("aten._scaled_dot_product_efficient_attention.default", (*QKV, None, False, 0.1), ()),
        ("aten._efficient_attention_forward.default", (*QKV, None, None, None, None, None, 0.1, 0), ()),
        ("aten.native_dropout.default", (Ref("q"), 0.5, True), ()),
        ("aten.native_dropout.default", (Ref("q"), 0.0, None), ()),  # train=None trains; p=0 still draws
        ("aten.dropout.default", (Ref("q"), 0.5, True), ()),
        ("aten.rand_like.default", (Ref("q"),), ()),
        ("aten.bernoulli.p", (Ref("q"), 0.5), ()),
    ],
)
def test_random_calls_are_listed_with_their_node(target: str, args: tuple, kwargs: tuple) -> None:
    assert _random(_call(target, args, kwargs)) == (("node", target),)


def test_calls_without_the_random_tag_are_never_random() -> None:
    assert _random(_call("aten.relu.default", (Ref("q"),), seeded=False)) == ()
    assert _random(_call(SDPA, (*QKV, None, 0.5), seeded=False)) == ()  # the tag decides, then the arguments


@pytest.mark.parametrize("target", sorted(DROPOUT_P) + sorted(DROPOUT_TRAIN))
def test_dropout_argument_positions_match_torchs_schemas(target: str) -> None:
    _, name, overload = target.split(".")
    packet = getattr(torch.ops.aten, name, None)
    if packet is None or overload not in packet.overloads():
        pytest.skip(f"{target} is not in torch {torch.__version__}")
    op = getattr(packet, overload)
    assert torch.Tag.nondeterministic_seeded in op.tags
    arguments = op._schema.arguments
    if target in DROPOUT_P:
        position, arg, default = DROPOUT_P[target]
        assert (arguments[position].name, arguments[position].kwarg_only) == (arg, False)
        has = arguments[position].has_default_value()
        assert (arguments[position].default_value if has else None) == default
    else:
        position, arg = DROPOUT_TRAIN[target]
        assert (arguments[position].name, arguments[position].kwarg_only) == (arg, False)


class _Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3 if self.training else 0.0, is_causal=True)


@pytest.mark.parametrize("training", [False, True])
def test_compiled_attention_is_random_only_with_dropout(training: bool) -> None:
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    with torch.no_grad():
        fn = opgen.compile(_Attention().train(training), (q, k, v), cache=False)
    assert fn.artifact.random_calls == ((("scaled_dot_product_attention", SDPA),) if training else ())


def record_wraps(monkeypatch: pytest.MonkeyPatch) -> list[CompiledGraph]:
    """The graphs CUDA-graph mode will be given (torch.compile's graphs, which a test cannot reach else)."""
    graphs: list[CompiledGraph] = []
    wrap = CudaGraphs.wrap

    def recording(self: CudaGraphs, plain: Any, graph: CompiledGraph, *args: Any, **kwargs: Any) -> Any:
        graphs.append(graph)
        return wrap(self, plain, graph, *args, **kwargs)

    monkeypatch.setattr(CudaGraphs, "wrap", recording)
    return graphs


@pytest.mark.parametrize("training", [False, True])
def test_attention_under_torch_compile_is_random_only_with_dropout(
    training: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AOT graphs call the fused overload (`_scaled_dot_product_flash_attention_for_cpu` here) at
    dropout_p=0.0; in training they decompose attention, with `native_dropout`."""
    graphs = record_wraps(monkeypatch)
    torch._dynamo.reset()
    fn = torch.compile(_Attention().train(training), backend="opgen", options={"cuda_graphs": True})
    with torch.no_grad(), pytest.warns(opgen.OpgenWarning, match="no CUDA tensors"):
        fn(*(torch.randn(2, 4, 8, 16) for _ in range(3)))
    [graph] = graphs
    if training:
        assert graph.random_calls == (("native_dropout", "aten.native_dropout.default"),)
    else:
        assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in graph.source
        assert graph.random_calls == ()


class _Noise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


def test_random_calls_survive_the_cache() -> None:
    """`rand_like` is an ATen fallback: lowering tags fallbacks as random too."""
    with torch.no_grad():
        fn = opgen.compile(_Noise(), (torch.zeros(8),), fallback=True, cache=False)
    graph = fn.artifact
    assert graph.random_calls == (("rand_like", "aten.rand_like.default"),)
    assert CompiledGraph.from_json(graph.to_json()).random_calls == graph.random_calls


def test_graph_mode_decisions_with_random_ops() -> None:
    """Random ops never refuse a capture; a graph is refused for its own reasons, and says which random
    ops it has; a captured one says they draw fresh numbers on every replay."""
    x = torch.zeros(8)
    with torch.no_grad():
        with pytest.warns(opgen.OpgenWarning, match="CUDA graphs not used for _Noise: the graph has no CUDA tensors"):
            fn = opgen.compile(_Noise(), (x,), cuda_graphs=True, fallback=True, cache=False)
    assert fn.graph_status.reason == "the graph has no CUDA tensors (it runs on the CPU)"
    assert fn.graph_status.random == ("aten.rand_like.default",)
    captured = GraphStatus(captured=True, capture_seconds=0.5, random=("aten.rand_like.default",))
    assert captured.line() == (
        "CUDA graph: captured on the first call (0.50 s), replayed since; "
        "random ops (aten.rand_like.default) draw fresh numbers on every replay"
    )
    assert GraphStatus(captured=True).line() == "CUDA graph: captured on the first call (0.00 s), replayed since"
    counted = GraphStatus(captured=True, calls=lambda: (7, 2)).line()
    assert counted.startswith("CUDA graph: captured on the first call (0.00 s), replayed since (7 replays; 2 calls ")
    assert "ran plain: inputs unlike the capture's" in counted
    assert GraphStatus(captured=True, calls=lambda: (3, 0)).line().endswith("replayed since (3 replays)")
