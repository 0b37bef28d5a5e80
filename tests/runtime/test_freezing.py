"""Freezing under torch.compile(backend="opgen"): module weights bound as constants, checked by identity."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from opgen.runtime.execution.frozen import KEEP, frozen_function
from opgen.runtime.frontend import dynamo as dynamo_backend
from opgen.runtime.pipeline import default_pipeline

CHANNELS, FEATURES = 256, 512  # a linear weight of 8 rows: mkl_linear packs it


class ConvBnLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, CHANNELS, 3)
        self.bn = nn.BatchNorm2d(CHANNELS)
        self.fc = nn.Linear(CHANNELS, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class Counter(nn.Module):
    """A buffer the graph writes (a call counter) beside a weight it only reads."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.fc(x) * self.calls


def model(cls: type[nn.Module] = ConvBnLinear, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = cls()
    with torch.no_grad():  # batch-norm statistics that are not the identity, so folding shows
        for b in m.modules():
            if isinstance(b, nn.BatchNorm2d):
                b.running_mean.uniform_(-1, 1)
                b.running_var.uniform_(0.5, 2)
    return m.eval()


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The functions the backend compiled (what `compile_aten_graph` returned), in order."""
    made: list[Any] = []
    original = dynamo_backend.compile_aten_graph

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(dynamo_backend, "compile_aten_graph", recording)
    torch._dynamo.reset()
    yield made
    torch._dynamo.reset()


def backend(**options: Any) -> Callable[[nn.Module], Any]:
    return lambda m: torch.compile(m, backend="opgen", options={"cache": False, **options})


X = torch.randn(8, 3, 6, 6)
# Against eager: MKL's packed product (mkl_linear) and the folded batch norm round in another order
# than eager's addmm and batch norm (4096 outputs: one in ~8 runs differed by 1.2e-5).
CLOSE = {"atol": 1e-4, "rtol": 1e-4}


def test_frozen_weights_fold_and_pack_and_match_eager(compiled: list[Any]) -> None:
    m = model()
    with torch.no_grad():
        out = backend()(m)(X)
        torch.testing.assert_close(out, m(X), **CLOSE)
    (fn,) = compiled
    source, report = fn.artifact.source, fn.report()
    assert 'constants["frozen:' in source and "fold batch norm" in source
    assert "def forward(arg" in source and source.count("def forward(") == 1
    forward_line = next(line for line in source.splitlines() if "def forward(" in line)
    assert forward_line.count(",") == 0  # the image alone: weights, biases and statistics are constants
    assert any(note.startswith("frozen: 8 parameters and buffers") for note in report.notes), report
    if "mkl_linear" in default_pipeline():  # the linear weight is packed once, at bind time
        assert "mkl._mkl_reorder_linear_weight.default" in report.torch_ops
        assert "mkl_linear(" in source


def test_inference_mode_freezes_too(compiled: list[Any]) -> None:
    m = model()
    with torch.inference_mode():
        out = backend()(m)(X)
    with torch.no_grad():
        torch.testing.assert_close(out, m(X), **CLOSE)
    assert "fold batch norm" in compiled[0].artifact.source


def test_freezing_off_keeps_weights_as_inputs_and_sees_updates(compiled: list[Any]) -> None:
    m = model()
    fn = backend(freezing=False)(m)
    with torch.no_grad():
        torch.testing.assert_close(fn(X), m(X), **CLOSE)
        m.bn.running_var.mul_(4)  # in place: the next call reads the new values
        m.fc.weight.add_(1)
        torch.testing.assert_close(fn(X), m(X), **CLOSE)
    assert "frozen:" not in compiled[0].artifact.source
    assert not any("frozen" in note for note in compiled[0].report().notes)


def test_frozen_weight_changed_in_place_is_not_seen(compiled: list[Any]) -> None:
    """What the README warns of: a folded statistic is read once, when the function is bound."""
    m = model()
    fn = backend()(m)
    with torch.no_grad():
        before = fn(X)
        m.bn.running_var.mul_(4)
        torch.testing.assert_close(fn(X), before)
        assert not torch.allclose(m(X), before)


def test_replaced_parameter_is_bound_anew_without_recompiling(compiled: list[Any]) -> None:
    """Dynamo does not guard parameter identity: opgen checks it and binds the new tensor."""
    m = model()
    fn = backend()(m)
    with torch.no_grad():
        fn(X)
        m.fc.weight = nn.Parameter(torch.randn(FEATURES, CHANNELS))
        m.bn.running_mean = torch.randn(CHANNELS)
        torch.testing.assert_close(fn(X), m(X), **CLOSE)
        torch.testing.assert_close(fn(X), m(X), **CLOSE)
    (made,) = compiled  # no recompile
    assert len(made.bindings) == 2
    newest = made.bindings[0][0]
    assert any(t is m.fc.weight for t in newest) and any(t is m.bn.running_mean for t in newest)


def test_two_instances_sharing_compiled_code_each_use_their_weights(compiled: list[Any]) -> None:
    first, second = model(seed=1), model(seed=2)
    a, b = backend()(first), backend()(second)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(a(X), first(X), **CLOSE)
            torch.testing.assert_close(b(X), second(X), **CLOSE)
    assert len(compiled) == 1 and len(compiled[0].bindings) == 2


def test_grad_enabled_does_not_freeze(compiled: list[Any]) -> None:
    m = model().requires_grad_(False)
    out = backend()(m)(X)
    torch.testing.assert_close(out, m(X), **CLOSE)
    assert "frozen:" not in compiled[0].artifact.source


def test_buffers_the_graph_writes_are_not_frozen(compiled: list[Any]) -> None:
    m, reference = model(Counter), model(Counter)
    fn = backend()(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fn(x), reference(x), **CLOSE)
    assert m.calls.item() == 3
    notes = compiled[0].report().notes
    assert any(n.startswith("frozen: 2 parameters") for n in notes) and any(
        n.startswith("not frozen: 1") for n in notes
    )


def test_training_batch_norm_statistics_are_not_frozen(compiled: list[Any]) -> None:
    m, reference = model().train(), model().train()
    fn = backend(fallback=True)(m)  # kernel_ops has no training batch norm: the ATen op runs it
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fn(X), reference(X), **CLOSE)
    torch.testing.assert_close(m.bn.running_mean, reference.bn.running_mean)
    torch.testing.assert_close(m.bn.running_var, reference.bn.running_var)
    assert m.bn.num_batches_tracked.item() == 2
    notes = compiled[0].report().notes
    assert "fold batch norm" not in compiled[0].artifact.source
    assert any(n.startswith("not frozen: 3 parameters and buffers") for n in notes), notes  # the statistics


def test_frozen_function_keeps_a_few_bindings() -> None:
    made: list[tuple[torch.Tensor, ...]] = []

    def make(tensors: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
        made.append(tensors)
        return lambda x: x + tensors[0]

    weights = [torch.full((2,), float(i)) for i in range(KEEP + 1)]
    fn = frozen_function(make, (1,), (0,), (weights[0],))
    x = torch.zeros(2)
    for w in [*weights, weights[-1], weights[0]]:
        torch.testing.assert_close(fn(x, w), x + w)
    assert len(made) == KEEP + 2  # each new weight bound once; weights[0], dropped as the oldest, bound again
    assert len(fn.bindings) == KEEP
    with pytest.raises(ValueError, match="2 frozen positions but 1 tensors"):
        frozen_function(make, (0, 1), (), (weights[0],))


def test_unknown_option_names_freezing_among_the_known() -> None:
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match=r"known: .*freezing"):
        torch.compile(nn.Linear(2, 2), backend="opgen", options={"freeze": True})(torch.randn(1, 2))
    torch._dynamo.reset()


def test_frozen_function_from_several_threads() -> None:
    weights = [torch.full((2,), float(i)) for i in range(3)]
    fn = frozen_function(lambda t: lambda x: x + t[0], (1,), (0,), (weights[0],))
    x, wrong = torch.zeros(2), []

    def work(offset: int) -> None:
        for i in range(300):
            w = weights[(i + offset) % 3]
            if not torch.equal(fn(x, w), x + w):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(fn.bindings) == 3
