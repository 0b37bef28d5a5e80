"""The onednn pass (and prepack's oneDNN post-ops): the rewritten IR, and each fused pattern against eager.

IR tests build programs by hand; model tests compile small modules with `opgen.compile` and compare
with eager PyTorch, with the pass in the pipeline, left out, and off where torch lacks oneDNN.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import opgen
from opgen.runtime import pipeline
from opgen.runtime.ir import (
    Input,
    KernelCall,
    Program,
    Ref,
    Return,
    TensorConstant,
    TensorMeta,
    Value,
    contiguous_strides,
)
from opgen.runtime.passes.layout import channels_last_strides
from opgen.runtime.passes.onednn import CONV_BINARY, CONV_UNARY, PACK, fuse_onednn

needs_onednn = pytest.mark.skipif("onednn" not in pipeline.default_pipeline(), reason="torch without oneDNN")
SHAPE = (2, 16, 16, 16)


def cpu(*shape: int, device: str = "cpu") -> TensorMeta:
    return TensorMeta(shape, contiguous_strides(shape), "float32", device)


def conv(x: str, out: str, weight: str = "w", device: str = "cpu") -> KernelCall:
    args = (Ref(x), Ref(weight), Ref("b"), (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    return KernelCall("convolution", args, (), (Value(out, cpu(*SHAPE, device=device)),), out, "aten.convolution")


def call(kernel: str, *args: object, out: str, **kwargs: object) -> KernelCall:
    return KernelCall(kernel, tuple(args), tuple(kwargs.items()), (Value(out, cpu(*SHAPE)),), out, f"aten.{kernel}")


def program(*body: object, device: str = "cpu", weight_is_input: bool = False) -> Program:
    constants = (TensorConstant("b", "b", cpu(16, device=device)),)
    inputs = (Input("x", cpu(*SHAPE, device=device)),)
    if weight_is_input:
        inputs += (Input("w", cpu(16, 16, 3, 3, device=device)),)
    else:
        constants += (TensorConstant("w", "w", cpu(16, 16, 3, 3, device=device)),)
    return Program("forward", inputs, constants, (), tuple(body))


def kernels(p: Program) -> list[str]:
    return [line.kernel for line in p.body if isinstance(line, KernelCall)]


def test_conv_relu_and_conv_add_relu_fuse_and_run_channels_last(registry) -> None:
    p = program(
        conv("x", "c1"),
        call("relu", Ref("c1"), out="r1"),
        conv("r1", "c2"),
        call("add", Ref("c2"), Ref("r1"), out="a2"),
        call("relu", Ref("a2"), out="r2"),
        call("mean", Ref("r2"), (-1, -2), True, out="m"),
        Return((Ref("m"), Ref("r1")), "tuple"),
    )
    out = fuse_onednn(p, registry)
    assert kernels(out) == ["clone", CONV_UNARY, "clone", CONV_BINARY, "clone", "mean"]
    (packed,) = out.setup  # one packed weight: same weight, same convolution parameters, same input size
    assert packed.kernel == PACK and packed.args == (Ref("w"), (1, 1), (1, 1), (1, 1), 1, SHAPE)
    entry, first, copy1, second, copy2, mean = out.body[:6]
    assert entry.args == (Ref("x"),) and first.args[0] == Ref(entry.outputs[0].name)  # the input, copied in once
    assert first.args[1:] == (Ref(packed.outputs[0].name), Ref("b"), (1, 1), (1, 1), (1, 1), 1, "relu", (), "")
    assert first.outputs[0].meta.stride == channels_last_strides(SHAPE)
    r1 = Ref(first.outputs[0].name)  # read channels-last inside the region: as x and as the residual z
    assert second.args[:2] == (r1, r1) and second.args[8:11] == ("add", 1.0, "relu")
    # values read outside the region (the mean, the caller) are copied back under their own names
    assert copy1.outputs[0] == Value("r1", cpu(*SHAPE)) and copy2.outputs[0] == Value("r2", cpu(*SHAPE))
    assert mean.args[0] == Ref("r2") and out.body[-1] == Return((Ref("m"), Ref("r1")), "tuple")


@pytest.mark.parametrize(
    ("kernel", "kwargs", "post"),
    [
        ("gelu", {"approximate": "tanh"}, ("gelu", (), "tanh")),
        ("silu", {}, ("swish", (), "")),
        ("leaky_relu", {"negative_slope": 0.2}, ("leaky_relu", (0.2,), "")),
        ("hardtanh", {"min_val": 0.0, "max_val": 6.0}, ("hardtanh", (0.0, 6.0), "")),
    ],
)
def test_activations_become_post_ops(registry, kernel: str, kwargs: dict, post: tuple) -> None:
    p = program(conv("x", "c1"), call(kernel, Ref("c1"), out="y", **kwargs), Return((Ref("y"),), "single"))
    fused = fuse_onednn(p, registry).body[1]
    assert fused.kernel == CONV_UNARY and fused.args[7:] == post and fused.outputs[0].name != "c1"


def test_a_conv_result_read_twice_keeps_its_activation_apart(registry) -> None:
    p = program(conv("x", "c1"), call("relu", Ref("c1"), out="r1"), Return((Ref("r1"), Ref("c1")), "tuple"))
    assert kernels(fuse_onednn(p, registry)) == ["clone", CONV_UNARY, "clone", "relu", "clone"]


def test_a_residual_add_at_one_position_stays_apart(registry) -> None:
    """At 1x1 (ResNet-18's last stage on a 32x32 image) oneDNN's binary post-op fails on AVX-512 machines
    ("could not create a memory"): the add stays an ATen call beside the packed convolution."""
    one = (1, 256, 1, 1)
    args = (Ref("x"), Ref("w"), Ref("b"), (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    body = (
        KernelCall("convolution", args, (), (Value("c1", cpu(*one)),), "c1", "aten.convolution"),
        KernelCall("add", (Ref("c1"), Ref("x")), (), (Value("a1", cpu(*one)),), "a1", "aten.add"),
        Return((Ref("a1"),), "single"),
    )
    constants = (TensorConstant("b", "b", cpu(256)), TensorConstant("w", "w", cpu(256, 256, 3, 3)))
    p = Program("forward", (Input("x", cpu(*one)),), constants, (), body)
    found = kernels(fuse_onednn(p, registry))
    assert CONV_UNARY in found and "add" in found and CONV_BINARY not in found


def test_tiny_convolutions_stay_with_aten(registry) -> None:
    tiny = KernelCall(
        "convolution", (Ref("x"), Ref("w"), Ref("b"), (1, 1), (1, 1), (1, 1), False, (0, 0), 1), (),
        (Value("c1", cpu(1, 16, 2, 2)),), "c1", "aten.convolution",
    )  # fmt: skip
    p = program(tiny, Return((Ref("c1"),), "single"))
    assert fuse_onednn(p, registry) == p


def test_cuda_programs_and_runtime_weights_are_left_alone(registry) -> None:
    relu = Return((Ref("c1"),), "single")
    on_cuda = program(conv("x", "c1", device="cuda:0"), relu, device="cuda:0")
    assert fuse_onednn(on_cuda, registry) == on_cuda
    weight_as_input = program(conv("x", "c1"), relu, weight_is_input=True)
    assert fuse_onednn(weight_as_input, registry) == weight_as_input


class ConvNet(nn.Module):
    """conv+bias+relu, a residual conv+add+relu, a conv with another activation, and an exit into a mean."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 16, 1, bias=False)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.relu(self.conv1(x))
        b = torch.relu(self.conv2(a) + a)
        c = self.activation(self.conv3(b))
        return c.mean((-1, -2)), b  # b leaves the region twice: into conv3 and to the caller


def compile_and_compare(model: nn.Module, inputs: tuple[torch.Tensor, ...], passes=None, atol=1e-4) -> object:
    with torch.no_grad():
        compiled = opgen.compile(model.eval(), inputs, passes=passes, cache=False)
        for _ in range(2):  # the second call reuses persistent buffers
            torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=atol, rtol=1e-4)
    return compiled


@needs_onednn
@pytest.mark.parametrize("activation", [nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Hardswish(), nn.LeakyReLU(0.1)])
def test_conv_patterns_match_eager(activation: nn.Module) -> None:
    torch.manual_seed(0)
    compiled = compile_and_compare(ConvNet(activation), (torch.randn(2, 3, 32, 32),))
    source = compiled.artifact.source
    assert "mkldnn_convolution_pointwise_binary(" in source and "'relu', (), '')" in source
    assert "convolution(" not in source.replace("mkldnn_convolution_pointwise", "")
    report = str(compiled.report())  # the convolutions are kernel_ops calls; only the packing is torch.ops
    assert "mkldnn._reorder_convolution_weight.default" in report and "_convolution_pointwise" not in report
    assert "kernel_ops.mkldnn_convolution_pointwise" in source or "= kernel_ops.mkldnn_convolution_pointwise" in source


@needs_onednn
def test_grouped_strided_and_dilated_convs_match_eager() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=4), nn.ReLU(), nn.Conv2d(16, 8, 3, dilation=2), nn.Sigmoid()
    )
    compile_and_compare(model, (torch.randn(2, 16, 48, 48),))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()  # weights of prepack.MIN_WEIGHT elements: packed at any row count from MIN_ROWS
        self.fc1, self.fc2 = nn.Linear(256, 512), nn.Linear(512, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))  # linear+gelu, linear+add


def without_mkl() -> list[str]:
    """The default passes less `mkl_linear`, which takes the linear layers below 256 rows from `prepack`."""
    return [p for p in pipeline.default_pipeline() if p != "mkl_linear"]


@needs_onednn
def test_linear_gelu_and_linear_add_match_eager() -> None:
    torch.manual_seed(0)
    compiled = compile_and_compare(Mlp(), (torch.randn(256, 256),))  # 256 rows: oneDNN's, with post-ops
    source = compiled.artifact.source
    assert "'gelu', (), 'none')" in source and "mkldnn_linear_pointwise_binary(" in source


@needs_onednn
def test_only_large_linear_layers_are_packed() -> None:
    """32x128 @ 128x128 (2^19 multiply-adds) stays addmm, where MKL is faster; 128x1024 is packed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1024))
    compiled = compile_and_compare(model, (torch.randn(32, 128),), passes=without_mkl())
    source = compiled.artifact.source
    assert "reorder_linear_weight(p_2_weight" in source and "reorder_linear_weight(p_0_weight" not in source
    assert "addmm_out(p_0_bias" in source and "mkldnn_linear_pointwise(buf1, packed0, p_2_bias" in source


@needs_onednn
def test_the_pass_is_optional() -> None:
    torch.manual_seed(0)
    without = [p for p in pipeline.default_pipeline() if p not in ("onednn", "prepack")]
    compiled = compile_and_compare(ConvNet(nn.ReLU()), (torch.randn(2, 3, 32, 32),), passes=without)
    assert "mkldnn" not in compiled.artifact.source


def test_off_without_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    passes = pipeline.default_pipeline()
    assert "onednn" not in passes and "prepack" not in passes
    torch.manual_seed(0)
    compiled = compile_and_compare(ConvNet(nn.ReLU()), (torch.randn(2, 3, 32, 32),), passes=passes)
    assert "mkldnn" not in compiled.artifact.source
