"""The cudnn pass on hand-built CUDA programs: which chains fuse, and where the channels-last region ends.

Only the IR is checked here (no GPU needed); tests/runtime/test_cuda.py runs the rewritten graphs.
"""

from __future__ import annotations

from opgen.runtime.ir import (
    Input,
    KernelCall,
    Program,
    Ref,
    Return,
    Sym,
    TensorConstant,
    TensorMeta,
    Value,
    contiguous_strides,
)
from opgen.runtime.passes.cudnn import fuse_cudnn
from opgen.runtime.passes.layout import channels_last_strides

SHAPE = (1, 8, 6, 6)


def cuda(*shape: int, device: str = "cuda:0") -> TensorMeta:
    return TensorMeta(shape, contiguous_strides(shape), "float32", device)


def conv(x: str, out: str, weight: str = "w", device: str = "cuda:0") -> KernelCall:
    args = (Ref(x), Ref(weight), Ref("b"), (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    return KernelCall("convolution", args, (), (Value(out, cuda(*SHAPE, device=device)),), out, "aten.convolution")


def call(kernel: str, *args: object, out: str, **kwargs: object) -> KernelCall:
    return KernelCall(kernel, tuple(args), tuple(kwargs.items()), (Value(out, cuda(*SHAPE)),), out, f"aten.{kernel}")


def program(*body: object, device: str = "cuda:0") -> Program:
    constants = (
        TensorConstant("w", "w", cuda(8, 8, 3, 3, device=device)),
        TensorConstant("b", "b", cuda(8, device=device)),
    )
    return Program("forward", (Input("x", cuda(*SHAPE, device=device)),), constants, (), tuple(body))


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
    out = fuse_cudnn(p, registry)
    assert kernels(out) == ["cudnn_convolution_relu", "clone", "cudnn_convolution_add_relu", "clone", "mean"]
    (pack,) = out.setup  # the weight, once, in channels-last
    assert pack.kernel == "clone" and pack.kwargs == (("memory_format", Sym("memory_format", "channels_last")),)
    first, copy1, second, copy2, mean = out.body[:5]
    assert first.args[1] == Ref(pack.outputs[0].name) and second.args[1] == Ref(pack.outputs[0].name)
    assert first.outputs[0].meta.stride == channels_last_strides(SHAPE)
    assert second.args[0] == Ref(first.outputs[0].name)  # region values are read channels-last inside it
    assert second.args[2] == Ref(first.outputs[0].name) and second.args[3] == 1  # z, alpha
    # values read outside the region (the mean, the caller) are copied back under their own names
    assert copy1.outputs[0] == Value("r1", cuda(*SHAPE)) and copy2.outputs[0] == Value("r2", cuda(*SHAPE))
    assert mean.args[0] == Ref("r2") and out.body[-1] == Return((Ref("m"), Ref("r1")), "tuple")


def test_a_conv_result_read_twice_is_not_fused(registry) -> None:
    p = program(conv("x", "c1"), call("relu", Ref("c1"), out="r1"), Return((Ref("r1"), Ref("c1")), "tuple"))
    assert kernels(fuse_cudnn(p, registry))[0] == "convolution"


def test_cpu_programs_are_left_alone(registry) -> None:
    p = program(conv("x", "c1", device="cpu"), call("relu", Ref("c1"), out="r1"), Return((Ref("r1"),), "single"))
    p = Program(p.name, p.inputs, p.constants, p.setup, tuple(_on_cpu(line) for line in p.body))
    assert fuse_cudnn(p, registry) == p


def _on_cpu(line: object) -> object:
    if isinstance(line, KernelCall):
        outputs = tuple(
            Value(v.name, TensorMeta(SHAPE, contiguous_strides(SHAPE), "float32", "cpu")) for v in line.outputs
        )
        return KernelCall(line.kernel, line.args, line.kwargs, outputs, line.node, line.target)
    return line


def test_grouped_conv_add_relu_is_not_fused_with_the_add(registry) -> None:
    grouped = KernelCall(
        "convolution",
        (Ref("x"), Ref("w"), Ref("b"), (1, 1), (1, 1), (1, 1), False, (0, 0), 2),
        (),
        (Value("c1", cuda(*SHAPE)),),
        "c1",
        "aten.convolution",
    )
    p = program(
        grouped,
        call("add", Ref("c1"), Ref("x"), out="a1"),
        call("relu", Ref("a1"), out="r1"),
        Return((Ref("r1"),), "single"),
    )
    assert "cudnn_convolution_add_relu" not in kernels(fuse_cudnn(p, registry))
