"""The outer_products pass: a matrix product over a contraction of one element is a broadcast `mul`
(transformers' rotary angles in 5.17, `inv_freq[None, :, None] @ position_ids[:, None, :]`)."""

from __future__ import annotations

import random
import re

import pytest
import torch
from fusion_interp import compile_as_on_cuda, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen


class Rotary(nn.Module):
    """transformers' `LlamaRotaryEmbedding.forward` as in 5.17: the angles as a float32 product."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv_freq @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Products(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a @ b) * 2


def calls(fn: object) -> list[str]:
    """The ATen op of each call of the compiled function's body (its comments name them: `# mm: aten.mul.Tensor`)."""
    code = fn.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    return [op.split(".")[1] for op in re.findall(r"  # [\w, ]+: (aten\.[\w.]+)", code)]


def rotary() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return Rotary(), (torch.randn(1, 1, 16, dtype=torch.bfloat16), torch.tensor([[37]]))


@pytest.mark.parametrize(
    ("a", "b"),
    [((3, 1), (1, 5)), ((2, 3, 1), (2, 1, 5)), ((1, 8, 1), (1, 1, 1))],
    ids=["mm", "bmm", "rotary_shapes"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_product_over_one_element_is_a_mul_with_the_same_values(a, b, dtype) -> None:  # type: ignore[no-untyped-def]
    model, inputs = Products(), (torch.randn(*a, dtype=dtype), torch.randn(*b, dtype=dtype))
    with torch.no_grad():
        fn = opgen.compile(model, inputs, cache=False)
        got, want = fn(*inputs), model(*inputs)  # type: ignore[operator]
    assert "mm" not in calls(fn) and "bmm" not in calls(fn) and "mul" in calls(fn), calls(fn)
    assert torch.equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.randn(2, 3, 2), torch.randn(2, 2, 5)),  # two elements summed
        lambda: (torch.randn(5, 3, 1).permute(1, 0, 2), torch.randn(3, 1, 4)),  # mul would lay its result out as a
    ],
    ids=["contraction_of_two", "mul_strides_differ"],
)
def test_a_longer_contraction_or_another_layout_stays_a_product(make) -> None:  # type: ignore[no-untyped-def]
    model, inputs = Products(), make()
    with torch.no_grad():
        fn = opgen.compile(model, inputs, cache=False)
        torch.testing.assert_close(fn(*inputs), model(*inputs))  # type: ignore[operator]
    assert "bmm" in calls(fn) and "mul" in calls(fn), calls(fn)  # the product, then its scale


def test_the_rotary_angles_run_without_a_product() -> None:
    model, inputs = rotary()
    with torch.no_grad():
        fn = opgen.compile(model, inputs, cache=False)
        for got, want in zip(fn(*inputs), model(*inputs), strict=True):  # type: ignore[operator]
            assert torch.equal(got, want)
    assert "bmm" not in calls(fn), calls(fn)


def test_as_on_cuda_the_angles_join_the_kernel_of_their_cat(monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs = rotary()
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs)
    assert any({"bmm", "cat"} <= set(k.nodes) for k in kernels), [k.nodes for k in kernels]
    with torch.no_grad():
        for got, want in zip(fn(*inputs), model(*inputs), strict=True):  # type: ignore[operator]
            torch.testing.assert_close(got, want)


@needs_triton
def test_the_rotary_kernels_run_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                   request: pytest.FixtureRequest) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model, inputs = rotary()
    checks: list[str] = []
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs, checks)
    with torch.no_grad():
        for got, want in zip(fn(*inputs), model(*inputs), strict=True):  # type: ignore[operator]
            torch.testing.assert_close(got, want)
    assert kernels and len(checks) >= len(kernels)


def _layouts(rng: random.Random, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `shape` in one of the layouts a graph hands a product: contiguous, permuted, sliced with a
    step, or expanded from a size-1 dimension."""
    way = rng.choice(["contiguous", "permuted", "stepped", "expanded"])
    if way == "permuted":
        order = list(range(len(shape)))
        rng.shuffle(order)
        base = torch.empty([shape[d] for d in order])
        return base.permute([order.index(d) for d in range(len(shape))])
    if way == "stepped":
        return torch.empty(*shape[:-1], shape[-1] * 2)[..., ::2]
    if way == "expanded" and shape[0] > 1:
        return torch.empty(1, *shape[1:]).expand(shape)
    return torch.empty(shape)


def test_the_layout_rule_agrees_with_atens_mul() -> None:
    """`_mul_keeps_order` (TensorIterator's order of dimensions, in Python: passes import no torch) says a
    contiguous result exactly where ATen's `mul` returns one, over many operand layouts."""
    from opgen.runtime.ir import TensorMeta
    from opgen.runtime.passes.outer_products import _mul_keeps_order

    rng = random.Random(0)
    seen = set()
    for _ in range(1000):
        b, m, n = (rng.choice([1, 2, 3, 5]) for _ in range(3))
        lead = (b,) if rng.random() < 0.7 else ()  # bmm's operands, or mm's
        a, c = _layouts(rng, (*lead, m, 1)), _layouts(rng, (*lead, 1, n))
        want = torch.mul(a, c)
        contiguous = want.stride() == torch.empty(want.shape).stride()
        metas = [TensorMeta(tuple(t.shape), t.stride(), "float32", "cpu") for t in (a, c)]
        assert _mul_keeps_order(*metas, tuple(want.shape)) == contiguous, (a.stride(), c.stride(), want.stride())
        seen.add(contiguous)
    assert seen == {True, False}
