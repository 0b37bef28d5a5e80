"""The casts pass: a dtype cast moves through the views between it and the pointwise nodes it feeds or
reads (gpt-fast's rotary embedding in half precision: `x.float()` viewed as pairs, `type_as(x)` of the
flattened result), so that it joins their kernel instead of running as an ATen copy.

On the CPU the program is relabelled as CUDA around the passes (split_bias, casts, lift_views, fusion:
`fusion_interp.compile_as_on_cuda`). Kernels are bound to their ATen calls, or where triton is installed
and there is no GPU, run in Triton's interpreter with every config and checked against them.
"""

from __future__ import annotations

import pytest
import torch
from fusion_interp import compile_as_on_cuda, cpu_programs_unchanged, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.passes.fusion.casts import view_strides

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Rotary(nn.Module):
    """gpt-fast's rotary embedding of a slice of a fused projection's output (q of qkv), in x's dtype;
    `scaled`: a pointwise node reads the result (through the flattening view)."""

    def __init__(self, scaled: bool = False) -> None:
        super().__init__()
        self.scaled = scaled

    def forward(self, qkv: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        from opgen.bench.decode_models import apply_rotary

        q = qkv[..., :32].view(*qkv.shape[:-1], 4, 8)  # a strided view: the rest of the row is k and v
        return apply_rotary(q, freqs) * 2 if self.scaled else apply_rotary(q, freqs)


class CastThen(nn.Module):
    """A float32 cast viewed, then `then`: a pointwise node (moves), a product or the output (stays)."""

    def __init__(self, then: str) -> None:
        super().__init__()
        self.then = then

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        v = x.float().reshape(4, 6)
        if self.then == "matmul":
            return v @ y
        if self.then == "returned":
            return v, v + 1
        return torch.sigmoid(v).permute(1, 0).to(x.dtype) + 1  # the cast back reads a permute: strides differ


def rotary(dtype: torch.dtype, scaled: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return Rotary(scaled), (torch.randn(2, 1, 48).to(dtype), torch.randn(1, 4, 2))


def casts_outside_kernels(fn: object) -> int:
    forward = fn.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    return forward.count("_to_copy(")


@pytest.mark.parametrize(
    ("shape", "stride", "new"),
    [
        ((1, 1, 4, 32), (256, 256, 32, 1), (1, 1, 4, 16, 2)),  # q's heads of a fused projection, as pairs
        ((8, 1, 4, 32), (384, 384, 32, 1), (8, 1, 4, 16, 2)),  # a batch of them: rows apart
        ((8, 1, 4, 16, 2), (128, 128, 32, 2, 1), (8, 1, 4, 32)),  # flattened back
        ((8, 4, 32), (384, 32, 1), (8, 128)),  # the heads of each row are adjacent: one chunk
        ((8, 4, 32), (32, 256, 1), (8, 128)),  # transposed rows: a reshape would copy
        ((2, 3), (1, 2), (6,)),  # column-major: would copy
        ((2, 1, 3), (3, 99, 1), (6,)),  # a size-1 dimension's stride is free
        ((4, 6), (6, 1), (2, 2, 1, 6)),
        ((), (), (1, 1)),
    ],
)
def test_view_strides_are_atens(shape, stride, new) -> None:  # type: ignore[no-untyped-def]
    storage = torch.zeros(4096)
    t = storage.as_strided(shape, stride) if shape else storage[0]
    try:
        want = t.view(new).stride()
    except RuntimeError:
        want = None
    assert view_strides(shape, stride, new) == want


@pytest.mark.parametrize(
    ("target", "args", "apply"),
    [
        ("aten.select.int", (4, 0), lambda t: t.select(4, 0)),
        ("aten.select.int", (-1, 1), lambda t: t.select(-1, 1)),
        ("aten.select.int", (1, -2), lambda t: t.select(1, -2)),
        ("aten.slice.Tensor", (3, 2, 6), lambda t: t[:, :, :, 2:6]),
        ("aten.slice.Tensor", (3, -3, 8, 2), lambda t: t[:, :, :, -3::2]),
        ("aten.unsqueeze.default", (2,), lambda t: t.unsqueeze(2)),
        ("aten.unsqueeze.default", (-1,), lambda t: t.unsqueeze(-1)),
        ("aten.permute.default", ((0, 2, 1, 4, 3),), lambda t: t.permute(0, 2, 1, 4, 3)),
        ("aten.view.default", ((2, 3, 4, 16),), lambda t: t.view(2, 3, 4, 16)),
        ("aten.view.default", ((2, 3, 64),), lambda t: t.view(2, 3, 64)),
    ],
)
def test_a_moved_view_gets_atens_strides_and_offset(target, args, apply) -> None:  # type: ignore[no-untyped-def]
    """Each view a cast moves below, applied to a strided input at an offset (pairs of q's heads in a fused
    projection), against ATen's own view of the same storage."""
    from opgen.runtime.ir import KernelCall, Ref, TensorMeta, Value
    from opgen.runtime.passes.fusion.casts import _viewed

    source = torch.zeros(4096).as_strided((2, 3, 4, 8, 2), (400, 128, 16, 2, 1), 5)
    want = apply(source)
    meta = TensorMeta(tuple(source.shape), source.stride(), "bfloat16", "cuda:0", source.storage_offset())
    out = TensorMeta(tuple(want.shape), want.stride(), "float32", "cuda:0", 0)
    line = KernelCall("view", (Ref("x"), *args), (), (Value("y", out),), "n", target)
    got = _viewed(line, meta)
    assert got is not None and (got.shape, got.stride, got.offset) == (want.shape, want.stride(), want.storage_offset())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_rotary_casts_join_its_kernel(monkeypatch, dtype) -> None:
    model, inputs = rotary(dtype)
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs)
    (kernel,) = kernels  # the casts up to float32 (one a half of the pairs), the rotation, the stack, the cast back
    assert {"_to_copy", "_to_copy_1", "cat", "sub", "add"} <= set(kernel.nodes), kernel.nodes
    assert casts_outside_kernels(fn) == 0
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), model(*inputs), rtol=0, atol=0)


def test_a_pointwise_node_after_the_flattening_view_takes_the_cast_back(monkeypatch) -> None:
    """There `lift_views` moves the view back above the cast, which joins the node reading it: two kernels
    either way (the stack's, then the scale's), no ATen copy."""
    model, inputs = rotary(torch.bfloat16, scaled=True)
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs)
    assert len(kernels) == 2 and "_to_copy_1" in kernels[1].nodes and casts_outside_kernels(fn) == 0
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), model(*inputs), rtol=0, atol=0)


@pytest.mark.parametrize("then", ["matmul", "returned", "permuted"])
def test_a_cast_read_by_a_product_or_returned_or_viewed_apart_stays(monkeypatch, then) -> None:
    model, inputs = CastThen(then), (torch.randn(24).half(), torch.randn(6, 3))
    fn, _ = compile_as_on_cuda(monkeypatch, model, inputs)
    assert casts_outside_kernels(fn) == (0 if then == "permuted" else 1)  # permuted: the first moves down
    source = fn.artifact.source  # type: ignore[attr-defined]
    if then == "permuted":  # the cast back reads a permute of the sigmoid: moved up it would change strides
        assert "permute(" in source
    with torch.no_grad():
        got, want = fn(*inputs), model(*inputs)
    torch.testing.assert_close(got, want)


def test_cpu_programs_are_unchanged() -> None:
    cpu_programs_unchanged(*rotary(torch.bfloat16), "casts")


@needs_triton
def test_the_rotary_kernel_runs_in_the_interpreter(monkeypatch, request) -> None:
    """float16 (the interpreter's numpy has no bfloat16): the kernel loads the strided pairs of the
    half-precision input, converts, rotates, stacks and converts back."""
    if ran_in_fresh_interpreter(request):
        return
    model, inputs = rotary(torch.float16)
    checks: list[str] = []
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs, checks)
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), model(*inputs), rtol=1e-3, atol=1e-3)
    assert len(kernels) == 1 and checks == [kernels[0].name]


@cuda
def test_on_the_gpu_the_rotary_is_one_kernel_in_bfloat16() -> None:
    model = Rotary().cuda()
    inputs = (torch.randn(8, 1, 48, device="cuda", dtype=torch.bfloat16), torch.randn(1, 4, 2, device="cuda"))
    with torch.no_grad():
        fn = opgen.compile(model, inputs, cache=False)
        torch.testing.assert_close(fn(*inputs), model(*inputs), rtol=1e-2, atol=1e-2)
    assert casts_outside_kernels(fn) == 0, fn.artifact.source  # type: ignore[attr-defined]
