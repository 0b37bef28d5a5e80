"""Pointwise nodes and per-channel means in the cudnn pass's channels-last region (passes.region_ops):
EfficientNet's SiLU and squeeze-excitation stay channels-last between convolutions.

IR tests build CUDA programs by hand (no GPU needed); with a GPU a squeeze-excitation block runs.
"""

from __future__ import annotations

import pytest
import torch
from fusion_interp import compile_as_on_cuda, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.ir import Input, KernelCall, Program, Ref, Return, TensorConstant, TensorMeta, Value
from opgen.runtime.ir import contiguous_strides as dense
from opgen.runtime.passes.cudnn import fuse_cudnn
from opgen.runtime.passes.layout import channels_last_strides

N, C, H, W = 2, 8, 5, 5
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def meta(*shape: int) -> TensorMeta:
    return TensorMeta(shape, dense(shape), "float32", "cuda:0")


def call(kernel: str, target: str, *args: object, out: str, shape=(N, C, H, W), **kwargs: object) -> KernelCall:
    return KernelCall(kernel, tuple(args), tuple(kwargs.items()), (Value(out, meta(*shape)),), out, target)


def conv(x: str, out: str, weight: str, shape=(N, C, H, W), padding=(1, 1)) -> KernelCall:
    args = (Ref(x), Ref(weight), None, (1, 1), padding, (1, 1), False, (0, 0), 1)
    return call("convolution", "aten.convolution.default", *args, out=out, shape=shape)


def program(*body: KernelCall, returned: str) -> Program:
    constants = tuple(TensorConstant(n, n, meta(*s)) for n, s in (("w", (C, C, 3, 3)), ("r", (C, C, 1, 1))))
    return Program("forward", (Input("x", meta(N, C, H, W)),), constants, (), (*body, Return((Ref(returned),))))


def squeeze_excitation(scale: str = "s") -> Program:
    pooled = (N, C, 1, 1)
    return program(
        conv("x", "c", "w"),
        call("silu", "aten.silu.default", Ref("c"), out="a"),
        call("mean", "aten.mean.dim", Ref("a"), (2, 3), True, out="m", shape=pooled),
        conv("m", "e", "r", shape=pooled, padding=(0, 0)),
        call("sigmoid", "aten.sigmoid.default", Ref("e"), out="s", shape=pooled),
        call("mul", "aten.mul.Tensor", Ref("a"), Ref(scale), out="y"),
        conv("y", "z", "w"),
        returned="z",
    )


def by_node(p: Program) -> dict[str, KernelCall]:
    return {line.node: line for line in p.body if isinstance(line, KernelCall)}


def copies_out(p: Program) -> list[str]:
    return [line.node for line in p.body if isinstance(line, KernelCall) and line.target.startswith("contiguous copy")]


def test_silu_and_the_squeeze_excitation_stay_channels_last(registry) -> None:
    out = fuse_cudnn(squeeze_excitation(), registry)
    lines = by_node(out)
    assert lines["a"].outputs[0].meta.stride == channels_last_strides((N, C, H, W))  # type: ignore[union-attr]
    assert lines["y"].outputs[0].meta.stride == channels_last_strides((N, C, H, W))  # type: ignore[union-attr]
    assert lines["m"].outputs[0].meta.stride == (C, 1, 1, 1)  # type: ignore[union-attr]  # as ATen's mean returns
    assert lines["y"].args[0] == Ref(lines["a"].outputs[0].name)  # type: ignore[union-attr]
    assert copies_out(out) == ["z"]  # only the returned value goes back to the graph's layout


def test_a_pointwise_node_reading_a_value_outside_the_region_leaves_it(registry) -> None:
    out = fuse_cudnn(squeeze_excitation(scale="x"), registry)  # a * x: x is the caller's NCHW tensor
    lines = by_node(out)
    assert lines["y"].outputs[0].meta.stride == dense((N, C, H, W))  # type: ignore[union-attr]
    assert "a" in copies_out(out)  # the product reads silu's result in the graph's layout


def test_a_mean_over_other_dims_leaves_the_region(registry) -> None:
    p = program(
        conv("x", "c", "w"),
        call("mean", "aten.mean.dim", Ref("c"), (1,), True, out="m", shape=(N, 1, H, W)),
        returned="m",
    )
    out = fuse_cudnn(p, registry)
    assert by_node(out)["m"].args[0] == Ref("c") and copies_out(out) == ["c"]


CL = torch.channels_last
OPERANDS = {  # name -> a CPU tensor with the layout a region value of that kind has
    "conv": torch.randn(N, C, H, W).to(memory_format=CL),
    "pooled_conv": torch.randn(N, C, 1, 1).to(memory_format=CL),  # a 1x1 convolution's result: (C, 1, C, C)
    "pooled": torch.randn(N, C, 1, 1),  # a mean's: (C, 1, 1, 1)
}
CALLS = {  # name -> (its IR line, reading the operands by name; what eager computes)
    "silu": (lambda: call("silu", "aten.silu.default", Ref("conv"), out="o"), lambda t: nn.functional.silu(t["conv"])),
    "silu_pooled": (
        lambda: call("silu", "aten.silu.default", Ref("pooled_conv"), out="o", shape=(N, C, 1, 1)),
        lambda t: nn.functional.silu(t["pooled_conv"]),
    ),
    "scale": (
        lambda: call("mul", "aten.mul.Tensor", Ref("conv"), Ref("pooled"), out="o"),
        lambda t: t["conv"] * t["pooled"],
    ),
    "scale_first": (
        lambda: call("mul", "aten.mul.Tensor", Ref("pooled_conv"), Ref("conv"), out="o"),
        lambda t: t["pooled_conv"] * t["conv"],
    ),
    "mean": (
        lambda: call("mean", "aten.mean.dim", Ref("conv"), (2, 3), True, out="o", shape=(N, C, 1, 1)),
        lambda t: t["conv"].mean((2, 3), keepdim=True),
    ),
    "mean_reversed": (
        lambda: call("mean", "aten.mean.dim", Ref("conv"), (-1, -2), True, out="o", shape=(N, C, 1, 1)),
        lambda t: t["conv"].mean((-1, -2), keepdim=True),
    ),
    "sum_pooled": (
        lambda: call("add", "aten.add.Tensor", Ref("pooled_conv"), Ref("pooled"), out="o", shape=(N, C, 1, 1)),
        lambda t: t["pooled_conv"] + t["pooled"],
    ),
}


@pytest.mark.parametrize("what", list(CALLS))
def test_the_result_strides_are_those_aten_returns(what) -> None:
    from opgen.runtime.passes.region_ops import region_meta

    line, eager = CALLS[what]
    region = {n: TensorMeta(tuple(t.shape), t.stride(), "float32", "cuda:0") for n, t in OPERANDS.items()}
    metas = {n: meta(*t.shape) for n, t in OPERANDS.items()}
    got = region_meta(line(), region, metas)
    assert got is not None and got.stride == eager(OPERANDS).stride()


def test_a_copy_to_a_named_layout_leaves_the_region() -> None:
    from opgen.runtime.ir import Sym
    from opgen.runtime.passes.region_ops import region_meta

    line = call(
        "clone", "aten.clone.default", Ref("c"), out="o", memory_format=Sym("memory_format", "contiguous_format")
    )
    region = {"c": TensorMeta((N, C, H, W), channels_last_strides((N, C, H, W)), "float32", "cuda:0")}
    assert region_meta(line, region, {"c": meta(N, C, H, W)}) is None


class SqueezeExcitation(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.conv, self.reduce, self.expand = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, 8, 1), nn.Conv2d(8, c, 1)
        self.bn, self.out = nn.BatchNorm2d(c), nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = nn.functional.silu(self.bn(self.conv(x)))
        s = torch.sigmoid(self.expand(nn.functional.silu(self.reduce(a.mean((2, 3), keepdim=True)))))
        return self.out(a * s) + x


def copies_per_call(fn: object, x: torch.Tensor) -> int:
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn(x)  # type: ignore[operator]
        torch.cuda.synchronize()
    return sum(1 for e in profile.events() if "copy" in e.name.lower() and e.device_type.name == "CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_on_the_gpu_a_squeeze_excitation_block_runs_channels_last(monkeypatch, dtype) -> None:
    from opgen.runtime.passes import cudnn

    model = SqueezeExcitation().eval().cuda().to(dtype)
    x = torch.randn(4, 16, 14, 14, device="cuda", dtype=dtype)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        got, want = fn(x), model(x)
        with monkeypatch.context() as m:  # the region as it was: convolutions, relu, add and pooling only
            m.setattr(cudnn, "region_meta", lambda *_: None)
            before = opgen.compile(model, (x,), cache=False)
    tol = 2e-3 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert got.stride() == want.stride()
    if dtype == torch.float32:  # convolutions no longer copy their inputs (in half precision the
        assert copies_per_call(fn, x) < copies_per_call(before, x)  # H100 run saw 3 copies either way)


class ChannelsLastPointwise(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(c, 1, 1))

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(x + self.bias) * s


def channels_last_case() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return ChannelsLastPointwise(), (torch.randn(2, 8, 5, 6).to(memory_format=CL), torch.randn(2, 8, 1, 1))


def test_a_channels_last_kernel_walks_memory_order(monkeypatch) -> None:
    """The fused kernel's flat index runs over (N, H, W, C): the channels-last tensors load at it directly."""
    model, inputs = channels_last_case()
    fn, (kernel,) = compile_as_on_cuda(monkeypatch, model, inputs)
    assert "tl.load(in0 + offs" in kernel.source and "tl.store(out0 + offs," in kernel.source
    assert "# pointwise kernel over 2x5x6x8" in kernel.source  # (N, H, W, C)
    with torch.no_grad():
        got, want = fn(*inputs), model(*inputs)  # type: ignore[operator]
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def permute_to_nhwc(x: str, out: str) -> KernelCall:
    """(N, C, H, W) -> (N, H, W, C) of an NCHW value, as the graph records it (strided)."""
    strided = TensorMeta((N, H, W, C), (C * H * W, W, 1, H * W), "float32", "cuda:0")
    return KernelCall("permute", (Ref(x), (0, 2, 3, 1)), (), (Value(out, strided),), out, "aten.permute.default")


def test_a_permute_that_layer_norms_read_views_the_channels_last_value(registry) -> None:
    nhwc = (N, H, W, C)
    p = program(
        conv("x", "c", "w"),
        permute_to_nhwc("c", "p"),
        KernelCall("native_layer_norm", (Ref("p"), (C,), None, None, 1e-6), (), (Value("n", meta(*nhwc)), None, None),
                   "n", "aten.native_layer_norm.default"),
        returned="n",
    )  # fmt: skip
    out = fuse_cudnn(p, registry)
    permute = by_node(out)["p"]
    assert permute.args[0] == Ref(by_node(out)["c"].outputs[0].name)  # type: ignore[union-attr]  # the channels-last value
    assert permute.outputs[0].meta.stride == dense(nhwc) and not copies_out(out)  # type: ignore[union-attr]


def test_a_permute_read_otherwise_keeps_the_copy_out(registry) -> None:
    p = program(
        conv("x", "c", "w"),
        permute_to_nhwc("c", "p"),
        returned="p",
    )  # fmt: skip
    out = fuse_cudnn(p, registry)
    assert by_node(out)["p"].args[0] == Ref("c") and copies_out(out) == ["c"]


class NormAfterBias(nn.Module):
    """ConvNeXt's block head after its depthwise convolution: bias, permute to (N, H, W, C), layer norm."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.bias, self.norm = nn.Parameter(torch.randn(c, 1, 1)), nn.LayerNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm((x + self.bias).permute(0, 2, 3, 1))


def norm_case() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return NormAfterBias(), (torch.randn(2, 8, 5, 6).to(memory_format=CL),)


def test_a_bias_add_of_channels_last_values_joins_the_norm_after_the_permute(monkeypatch) -> None:
    model, inputs = norm_case()
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs)
    (kernel,) = kernels
    assert {"add", "native_layer_norm"} <= set(kernel.nodes) and kernel.describe.startswith("row")
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), model(*inputs))  # type: ignore[operator]


@needs_triton
@pytest.mark.parametrize("case", [channels_last_case, norm_case], ids=["pointwise", "bias_then_norm"])
def test_the_channels_last_kernels_run_in_the_interpreter(monkeypatch, request, case) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model, inputs = case()
    checks: list[str] = []
    fn, kernels = compile_as_on_cuda(monkeypatch, model, inputs, checks)
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), model(*inputs))  # type: ignore[operator]
    assert kernels and len(checks) >= len(kernels)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.dw, self.norm = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(nn.functional.gelu(self.fc1(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        return x + (y * self.gamma).permute(0, 3, 1, 2)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_on_the_gpu_a_convnext_block_norms_channels_last_rows(dtype) -> None:
    model = ConvNeXtBlock().eval().cuda().to(dtype)
    x = torch.randn(2, 32, 14, 14, device="cuda", dtype=dtype)
    with torch.no_grad():
        fn = opgen.compile(model, (x,), cache=False)
        got, want = fn(x), model(x)
    tol = 5e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert got.stride() == want.stride()
    norms = [k for k in fn.artifact.fused if "native_layer_norm" in k.nodes]  # type: ignore[attr-defined]
    assert norms and any(n.startswith("dw") or "bias" in n for n in norms[0].nodes)  # the conv's bias joined the norm
