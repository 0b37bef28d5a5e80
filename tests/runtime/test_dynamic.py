"""Dynamic shapes: one compiled function for a range of sizes, through opgen.compile and the torch.compile backend."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from torch import nn
from torch.export import Dim

import opgen
from opgen.bench.models import GPTBlock
from opgen.runtime.errors import InputMismatchError, OpgenWarning
from opgen.runtime.frontend.dynamo import opgen_backend


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))


class MaskedAttention(nn.Module):
    """Attention with a padding mask input and a causal mask buffer sliced to the sequence length."""

    def __init__(self, width: int = 16, heads: int = 2, max_len: int = 65) -> None:
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(width, 3 * width)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, 2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = self.causal[:t, :t] & keep[:, None, None, :]  # type: ignore[index]
        scores = scores.masked_fill(~mask, -1e9)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t * c)


class SizeReshapes(nn.Module):
    """Reshapes whose sizes are arithmetic on the input sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        y = x.reshape(b * t, c).sum(1, keepdim=True).expand(b * t, 2)
        return y.reshape(b, 2 * t) * t + x.flatten(1)[:, : 2 * t]


def _check(fn, model, make, sizes) -> None:  # type: ignore[no-untyped-def]
    for size in sizes:
        args = make(*size) if isinstance(size, tuple) else make(size)
        torch.testing.assert_close(fn(*args), model(*args), rtol=1e-4, atol=1e-4)


def _keep(b: int, t: int) -> torch.Tensor:
    keep = torch.ones(b, t, dtype=torch.bool)
    keep[0, t // 2 + 1 :] = False
    return keep


B = Dim("batch", min=1, max=16)
T = Dim("seq", min=1, max=64)
CASES = {
    "mlp_batch": (MLP, lambda b: (torch.randn(b, 16),), ({0: B},), [1, 7, 16], 3),
    "cnn_batch": (CNN, lambda b: (torch.randn(b, 3, 8, 8),), ({0: B},), [1, 5, 16], 3),
    "attention_seq": (
        MaskedAttention,
        lambda t: (torch.randn(2, t, 16), _keep(2, t)),
        ({1: T}, {1: T}),
        [1, 9, 64],
        6,
    ),
    "decoder_both": (
        lambda: GPTBlock(width=32, heads=2, tokens=65),
        lambda b, t: (torch.randn(b, t, 32),),
        ({0: B, 1: T},),
        [(1, 1), (3, 17), (16, 64), (1, 64), (16, 1)],
        (2, 5),
    ),
    "reshapes_both": (
        SizeReshapes, lambda b, t: (torch.randn(b, t, 4),), ({0: B, 1: T},), [(1, 1), (5, 9), (16, 64)], (2, 3)
    ),
}  # fmt: skip


@pytest.mark.parametrize("backend", ["python", "cpp"])  # the generated Python, the C++ executor
@pytest.mark.parametrize("name", list(CASES))
def test_one_function_serves_the_range_through_opgen_compile(name: str, backend: str) -> None:
    factory, make, shapes, sizes, example = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)  # backend="cpp" runs the C++ executor, or the test fails
        example_args = make(*example) if isinstance(example, tuple) else make(example)
        fn = opgen.compile(model, example_args, dynamic_shapes=shapes, cache=False, backend=backend)
        _check(fn, model, make, sizes)
        report = fn.report()
    assert report.specializations == 1, "a size inside the range compiled again"
    assert report.ranges and "dynamic sizes" in str(report)


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("name", ["mlp_batch", "decoder_both", "reshapes_both"])
def test_one_function_serves_the_range_through_the_backend(name: str, backend: str) -> None:
    factory, make, _, sizes, example = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    compiles = []

    def counting(gm, example_inputs, **options):  # type: ignore[no-untyped-def]
        compiles.append(gm)
        return opgen_backend(gm, example_inputs, **options, backend=backend)

    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)
        fn = torch.compile(model, backend=counting, dynamic=True)
        # Dynamo specializes size 1 (its 0/1 rule): sizes from 2 share the graphs of the first call.
        sizes = [s for s in sizes if 1 not in (s if isinstance(s, tuple) else (s,))]
        _check(fn, model, make, sizes[:1])
        first = len(compiles)
        _check(fn, model, make, [*sizes[1:], (example if isinstance(example, tuple) else (example,))])
    assert len(compiles) == first, "a size inside the range compiled again"


def test_a_size_outside_the_range_is_an_error_naming_input_dimension_and_range() -> None:
    model = MLP().eval()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(4, 16),), dynamic_shapes=({0: B},), cache=False)
        outside = r"input 'x' \(position 1\), dimension 0: size 17 is outside the compiled range \[1, 16\]"
        with pytest.raises(InputMismatchError, match=outside):
            fn(torch.randn(17, 16))
        with pytest.raises(InputMismatchError, match="dimension 1"):
            fn(torch.randn(4, 15))
    assert fn.report().specializations == 1


def test_automatic_dynamic_recompiles_once_then_serves_new_sizes() -> None:
    model = SizeReshapes()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(2, 3, 4),), cache=False)
        _check(fn, model, lambda b, t: (torch.randn(b, t, 4),), [(2, 3), (2, 5)])
        assert fn.report().specializations == 2  # the static one, then one with the sequence dynamic
        _check(fn, model, lambda b, t: (torch.randn(b, t, 4),), [(2, 9), (2, 1), (2, 40)])
        assert fn.report().specializations == 2


def test_recompile_false_and_automatic_dynamic_false_keep_static_behaviour() -> None:
    model = SizeReshapes()
    with torch.no_grad():
        strict = opgen.compile(model, (torch.randn(2, 3, 4),), recompile=False, cache=False)
        with pytest.raises(InputMismatchError, match="recompiling is off"):
            strict(torch.randn(2, 5, 4))
        static = opgen.compile(model, (torch.randn(2, 3, 4),), automatic_dynamic=False, cache=False)
        _check(static, model, lambda b, t: (torch.randn(b, t, 4),), [(2, 5), (2, 6)])
        assert static.report().specializations == 3
        assert not static.report().ranges


def test_the_stride_of_a_size_one_dimension_is_free() -> None:
    """[T, 1, 4] with any stride in its size-1 dimension runs the specialization of a contiguous one: the
    checks (static and ranged) and the specialization key ignore strides of size-1 dimensions."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def odd(t: int) -> torch.Tensor:  # strides (4, 99, 1): as contiguous as (4, 4, 1)
        return torch.randn(t, 4).as_strided((t, 1, 4), (4, 99, 1))

    with torch.no_grad():
        strict = opgen.compile(model, (torch.randn(3, 1, 4),), recompile=False, cache=False)
        x = odd(3)
        torch.testing.assert_close(strict(x), model(x))
        ranged = opgen.compile(model, (torch.randn(3, 1, 4),), dynamic_shapes=({0: T},), recompile=False, cache=False)
        for t in (3, 5):
            x = odd(t)
            torch.testing.assert_close(ranged(x), model(x))
    assert strict.report().specializations == 1 and ranged.report().specializations == 1


def test_generated_code_binds_sizes_once_and_the_plan_says_what_is_per_call() -> None:
    model = GPTBlock(width=32, heads=2, tokens=65).eval()
    with torch.no_grad():
        fn = opgen.compile(model, (torch.randn(2, 5, 32),), dynamic_shapes=({0: B, 1: T},), cache=False)
    source = fn.artifact.source
    assert "= x.shape[0]" in source and "= x.shape[1]" in source
    assert "size0 = " in source  # compound size arithmetic bound once per call
    assert "as_strided(slot" in source  # bounded results: per-call views of buffers sized for the bounds
    note = next(n for n in fn.report().notes if n.startswith("memory plan"))
    assert not re.search(r"\b0 in reused buffers", note) and re.search(r"\b0 allocated per call", note), note
    with torch.no_grad():
        unbounded = opgen.compile(SizeReshapes(), (torch.randn(2, 3, 4),), dynamic_shapes=({1: Dim("t", min=1)},))
    note = next(n for n in unbounded.report().notes if n.startswith("memory plan"))
    assert not re.search(r"\b0 allocated per call", note), note


def test_inputs_sharing_a_size_must_agree() -> None:
    factory, make, shapes, _, example = CASES["attention_seq"]
    torch.manual_seed(0)
    model = factory().eval()
    with torch.no_grad():
        fn = opgen.compile(model, make(example), dynamic_shapes=shapes, cache=False)
        with pytest.raises(InputMismatchError, match=r"input 'keep' \(position 2\), dimension 1: size 5 breaks"):
            fn(torch.randn(2, 9, 16), _keep(2, 5))


def test_the_ranged_check_in_cpp_agrees_with_the_generated_one() -> None:
    from opgen._C import RangedInputCheck

    from opgen.runtime.execution.dynamic_guards import dynamic_check, input_check
    from opgen.runtime.execution.guards import InputSpec
    from opgen.runtime.ir.sizes import SizeRange

    specs = (
        InputSpec("x", (1, "s0", 4), ("4*s0", 4, 1), "float32", "cpu"),
        InputSpec("m", ("s0", "s0"), ("s0", 1), "bool", "cpu"),
    )
    ranges = (SizeRange("s0", 1, 8),)
    fast, slow = input_check(specs, ranges), dynamic_check(specs, ranges)
    assert isinstance(fast, type(RangedInputCheck([], [])))
    cases = [
        (torch.randn(1, 3, 4), torch.ones(3, 3, dtype=torch.bool)),  # fits
        (torch.randn(1, 1, 4), torch.ones(1, 1, dtype=torch.bool)),  # the lower bound
        (torch.randn(1, 8, 4), torch.ones(8, 8, dtype=torch.bool)),  # the upper bound
        (torch.randn(1, 9, 4), torch.ones(9, 9, dtype=torch.bool)),  # outside
        (torch.randn(1, 3, 4), torch.ones(3, 4, dtype=torch.bool)),  # s0 disagrees
        (torch.randn(1, 3, 4).transpose(1, 2).contiguous().transpose(1, 2), torch.ones(3, 3, dtype=torch.bool)),
        (torch.randn(1, 3, 4).double(), torch.ones(3, 3, dtype=torch.bool)),
        (torch.randn(1, 3), torch.ones(3, 3, dtype=torch.bool)),
    ]
    assert [fast(*c) for c in cases] == [slow(*c) for c in cases] == [True, True, True] + [False] * 5


def test_the_cache_key_holds_the_ranges(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    # 12 rows: the size class [8, high] (size_classes); [1, 7] is the same class, and graph, for both ranges
    model, x = MLP().eval(), torch.randn(12, 16)
    with torch.no_grad():
        first = opgen.compile(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=16)},))
        again = opgen.compile(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=16)},))
        wider = opgen.compile(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=32)},))
        z = torch.randn(3, 16)
        torch.testing.assert_close(again(z), model(z), rtol=1e-4, atol=1e-4)
        y = torch.randn(32, 16)
        torch.testing.assert_close(wider(y), model(y), rtol=1e-4, atol=1e-4)
    assert not first.report().from_cache and again.report().from_cache and not wider.report().from_cache
    assert again.artifact.ranges == first.artifact.ranges != wider.artifact.ranges
