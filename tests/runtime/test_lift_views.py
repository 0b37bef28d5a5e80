"""The lift_views pass: a permute or reshape moves above the pointwise node it reads, so that the nodes
on both sides of it fuse as one kernel (ConvNeXt's `linear -> permute -> layer scale -> residual add`,
Swin's `residual add -> reshape -> layer norm`).

On the CPU the program is relabelled as CUDA around the passes (split_bias, lift_views, fusion), with
oneDNN's passes left out so that linear layers stay `addmm`, as on CUDA. Kernels are bound to their
ATen calls, or where triton is installed and there is no GPU, run in Triton's interpreter with every
config and checked against them. With a GPU the models run for real.
"""

from __future__ import annotations

import pytest
import torch
from fusion_interp import compile_as_on_cuda, cpu_programs_unchanged, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = needs_triton


class BlockTail(nn.Module):
    """ConvNeXt's block less its convolution: norm and linear over channels-last, permute back, layer
    scale, residual add."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)
        self.gamma = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return y.mul(self.gamma.reshape(1, -1, 1, 1)) + x


class ResidualNorm(nn.Module):
    """Swin's block boundary: residual add over (B, H, W, C), reshape to (B, H*W, C), layer norm; `bias`:
    the add also takes a per-channel vector, which broadcasts the same way after the reshape."""

    def __init__(self, width: int = 8, bias: bool = False) -> None:
        super().__init__()
        self.norm, self.bias = nn.LayerNorm(width), nn.Parameter(torch.randn(width)) if bias else None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = x + torch.sigmoid(y)
        if self.bias is not None:
            s = s + self.bias
        b, h, w, c = s.shape
        return self.norm(s.reshape(b, h * w, c))


class Chain(nn.Module):
    """Two pointwise nodes, a permute, a pointwise node; `returned`: the permute is also an output;
    `matmul`: a product reads the permute."""

    def __init__(self, then: str = "add") -> None:
        super().__init__()
        self.then = then

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        p = (x * 2 + 1).permute(0, 2, 1)
        if self.then == "returned":
            return p, p + y
        if self.then == "matmul":
            return p @ y.transpose(1, 2)
        return p + y


class Rotary(nn.Module):
    """gpt-fast's rotary embedding: the pairs rotated, then `torch.stack`ed back (cat of unsqueezes)."""

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        from opgen.bench.decode_models import apply_rotary

        return apply_rotary(x, freqs)


class CausalMask(nn.Module):
    """transformers' causal mask of a decode step: the key positions compared with the query's, an add of
    the cache position unsqueezed three times (a chain of views between the add and the comparison)."""

    def __init__(self, keys: int = 8) -> None:
        super().__init__()
        self.register_buffer("offset", torch.zeros(1, dtype=torch.long))
        self.register_buffer("keys", torch.arange(keys))

    def forward(self, cache_position: torch.Tensor) -> torch.Tensor:
        query = (self.offset + cache_position).unsqueeze(0).unsqueeze(1).unsqueeze(3)
        return self.keys <= query


compiled = compile_as_on_cuda  # split_bias, lift_views and fusion as on CUDA


def check(fn: object, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)  # type: ignore[operator]


def block_tail() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return BlockTail(), (torch.randn(2, 8, 5, 6),)


def residual_norm(bias: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return ResidualNorm(bias=bias), (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8))


def chain(then: str = "add") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return Chain(then), (torch.randn(2, 5, 7), torch.randn(2, 7, 5))


def rotary() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return Rotary(), (torch.randn(1, 1, 4, 8), torch.randn(1, 4, 2))


def causal_mask() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return CausalMask(), (torch.tensor([5]),)


def test_the_rotary_pairs_and_their_stack_are_one_kernel(monkeypatch) -> None:
    model, inputs = rotary()
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels  # the unsqueezes moved above the products: the stack's cat reads them in its kernel
    assert {"mul", "sub", "add", "cat"} <= set(kernel.nodes), kernel.nodes
    check(fn, model, inputs)


def test_the_bias_add_scale_and_residual_add_are_one_kernel(monkeypatch) -> None:
    model, inputs = block_tail()
    fn, kernels = compiled(monkeypatch, model, inputs)
    norm, tail = kernels
    assert norm.nodes == ("native_layer_norm",) and set(tail.nodes) == {"addmm_bias", "mul", "add"}
    source = fn.artifact.source  # type: ignore[attr-defined]
    assert "mm_out(" in source and "addmm_out(" not in source  # the bias left cuBLAS for the kernel,
    assert "= permute(nobias" in source  # which reads the product through a permute (a view set up once)
    check(fn, model, inputs)


def test_a_permute_moves_above_a_chain_of_pointwise_nodes(monkeypatch) -> None:
    model, inputs = chain()
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels
    assert {"mul", "add", "add_1"} <= set(kernel.nodes)  # x * 2 + 1 and + y: one kernel, reading x permuted
    check(fn, model, inputs)


@pytest.mark.parametrize("bias", [False, True], ids=["add", "add_and_bias"])
def test_a_residual_add_reshaped_for_a_layer_norm_joins_its_row_kernel(monkeypatch, bias) -> None:
    model, inputs = residual_norm(bias)
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels
    assert {"sigmoid", "add", "native_layer_norm"} <= set(kernel.nodes) and kernel.describe.startswith("row")
    check(fn, model, inputs)


def test_a_chain_of_unsqueezes_is_one_view_and_the_add_joins_the_comparison(monkeypatch) -> None:
    model, inputs = causal_mask()
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels  # the add of [1, 1, 1, 1] broadcast into the comparison's kernel, never stored
    assert set(kernel.nodes) == {"add", "le"}, kernel.nodes
    body = fn.artifact.source.split("def forward(")[1]  # type: ignore[attr-defined]
    assert "unsqueeze(" not in body.split("def forward_profiled")[0]  # three links, one view of the add's operand
    with torch.no_grad():
        for position in (0, 5, 7):
            torch.testing.assert_close(fn(torch.tensor([position])), model(torch.tensor([position])))


def test_a_chain_read_along_the_way_or_of_a_strided_tensor_stays() -> None:
    from opgen.runtime.ir import Input, KernelCall, Program, Ref, Return, TensorMeta, Value
    from opgen.runtime.passes.fusion.lift_views import UNSQUEEZE, _composed

    def meta(shape: tuple[int, ...], stride: tuple[int, ...]) -> TensorMeta:
        return TensorMeta(shape, stride, "float32", "cuda:0")

    def program(source: TensorMeta, returned: tuple[str, ...]) -> Program:
        a = Value("a", meta((1, 4), (4, 1)) if source.is_contiguous() else meta((1, 4), (8, 2)))
        b = Value("b", meta((1, 1, 4), (4, 4, 1)) if source.is_contiguous() else meta((1, 1, 4), (8, 8, 2)))
        body = (
            KernelCall("unsqueeze", (Ref("x"), 0), (), (a,), "unsqueeze", UNSQUEEZE),
            KernelCall("unsqueeze", (Ref("a"), 1), (), (b,), "unsqueeze_1", UNSQUEEZE),
            Return(tuple(Ref(n) for n in returned), "tuple"),
        )
        return Program("forward", (Input("x", source),), (), (), body)

    contiguous, strided = meta((4,), (1,)), meta((4,), (2,))
    composed = _composed(program(contiguous, ("b",))).body
    assert len(composed) == 2 and composed[0].kernel == "view" and composed[0].args == (Ref("x"), (1, 1, 4))
    assert _composed(program(contiguous, ("a", "b"))).body == program(contiguous, ("a", "b")).body  # a is read
    assert _composed(program(strided, ("b",))).body == program(strided, ("b",)).body


@pytest.mark.parametrize("then", ["returned", "matmul"])
def test_a_permute_returned_or_read_by_a_product_stays(monkeypatch, then) -> None:
    model, inputs = chain(then)
    fn, kernels = compiled(monkeypatch, model, inputs)
    permuted = [k for k in kernels if "mul" in k.nodes]
    assert permuted and "permute" not in "".join(permuted[0].nodes)
    assert all(not n.startswith("lifted") for n in fn.artifact.source.split())  # type: ignore[attr-defined]
    check(fn, model, inputs)
    if then == "returned":  # the caller sees eager's strides: a view of the pointwise result
        with torch.no_grad():
            assert fn(*inputs)[0].stride() == model(*inputs)[0].stride()  # type: ignore[operator]


def test_only_a_reshape_that_inserts_ones_views_any_operand() -> None:
    from opgen.runtime.passes.fusion.lift_views import _inserted_ones

    assert _inserted_ones((2, 3), (2, 3, 1)) == [2]
    assert _inserted_ones((2, 3), (1, 2, 1, 3)) == [0, 2]
    assert _inserted_ones((2, 3), (2, 3)) is None  # nothing inserted
    assert _inserted_ones((2, 3), (6,)) is None and _inserted_ones((2, 3), (3, 2, 1)) is None


@pytest.mark.parametrize(
    ("make", "viewed"),
    [
        (lambda: torch.randn(4, 32, 2)[..., 0], (4, 32, 1)),  # gpt-fast's rotary pairs: strided, stacked
        (lambda: torch.randn(4, 32, 2)[..., 0], (1, 4, 1, 32)),
        (lambda: torch.randn(3, 5), (3, 1, 1, 5)),
        (lambda: torch.randn(5)[None].expand(3, 5), (3, 5, 1)),  # a broadcast operand
        (lambda: torch.randn(5), (1, 5, 1)),
    ],
)
def test_an_inserted_dimension_gets_the_stride_atens_view_gives(make, viewed) -> None:  # type: ignore[no-untyped-def]
    from opgen.runtime.passes.fusion.lift_views import _ones_inserted_strides

    t = make()
    assert _ones_inserted_strides(tuple(t.shape), t.stride(), viewed) == t.view(viewed).stride()


def test_cpu_programs_are_unchanged() -> None:
    cpu_programs_unchanged(*chain(), "lift_views")


@interpreter
@pytest.mark.parametrize("what", ["block_tail", "chain", "residual_norm", "rotary", "causal_mask"])
def test_the_kernels_through_views_run_in_the_interpreter(monkeypatch, request, what) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model, inputs = {"block_tail": block_tail, "chain": chain, "residual_norm": lambda: residual_norm(True),
                     "rotary": rotary, "causal_mask": causal_mask}[what]()  # fmt: skip
    checks: list[str] = []
    fn, kernels = compiled(monkeypatch, model, inputs, checks)
    check(fn, model, inputs)
    assert kernels and len(checks) >= len(kernels)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_on_the_gpu_the_block_tail_is_one_kernel_after_the_product(dtype) -> None:
    model, x = BlockTail(64).eval().cuda().to(dtype), torch.randn(2, 64, 14, 14, device="cuda", dtype=dtype)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        want, got = model(x), fn(x)
    tol = 5e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert any(set(k.nodes) == {"addmm_bias", "mul", "add"} for k in fn.artifact.fused)  # type: ignore[attr-defined]
