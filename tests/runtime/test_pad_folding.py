"""The pads pass, and the onednn pass on what it leaves (depthwise convolutions, asymmetric pads).

IR tests build programs by hand; model tests compile small modules with `opgen.compile` and compare
with eager PyTorch: symmetric, zero and asymmetric pads, odd and even sizes, strides 1 and 2, dense
and depthwise convolutions, TensorFlow's "SAME" padding as Hugging Face's MobileNetV2 applies it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

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
from opgen.runtime.passes.onednn import CONV_UNARY, PACK, fuse_onednn
from opgen.runtime.passes.pads import fold_pads

needs_onednn = pytest.mark.skipif("onednn" not in pipeline.default_pipeline(), reason="torch without oneDNN")


def cpu(*shape: int) -> TensorMeta:
    return TensorMeta(shape, contiguous_strides(shape), "float32", "cpu")


def pad(x: str, out: str, pads: tuple[int, ...], shape: tuple[int, ...], value: float = 0.0) -> KernelCall:
    return KernelCall("constant_pad_nd", (Ref(x), pads, value), (), (Value(out, cpu(*shape)),), out, "aten.pad")


def conv(x: str, out: str, shape: tuple[int, ...], padding=(0, 0), groups: int = 1, weight: str = "w") -> KernelCall:
    args = (Ref(x), Ref(weight), Ref("b"), (1, 1), padding, (1, 1), False, (0, 0), groups)
    return KernelCall("convolution", args, (), (Value(out, cpu(*shape)),), out, "aten.convolution")


def program(*body: object, weight: tuple[int, ...] = (8, 8, 3, 3)) -> Program:
    constants = (TensorConstant("w", "w", cpu(*weight)), TensorConstant("b", "b", cpu(weight[0])))
    return Program("forward", (Input("x", cpu(1, 8, 10, 10)),), constants, (), tuple(body))


def kernels(p: Program) -> list[str]:
    return [line.kernel for line in p.body if isinstance(line, KernelCall)]


def test_a_symmetric_zero_pad_becomes_the_convolutions_padding(registry) -> None:
    p = program(
        pad("x", "p", (1, 1, 2, 2), (1, 8, 14, 12)),
        conv("p", "c", (1, 8, 12, 10), padding=(1, 0)),
        Return((Ref("c"),), "single"),
    )
    (folded, _) = fold_pads(p, registry).body
    assert folded.kernel == "convolution" and folded.args[0] == Ref("x")
    assert folded.args[4] == (3, 1)  # (H, W): the pad's pairs run from the last dimension backwards


def test_a_zero_pad_of_nothing_disappears_and_every_convolution_reader_takes_the_source(registry) -> None:
    p = program(
        pad("x", "p", (0, 0, 0, 0), (1, 8, 10, 10)),
        conv("p", "c1", (1, 8, 8, 8)),
        conv("p", "c2", (1, 8, 8, 8)),
        Return((Ref("c1"), Ref("c2")), "tuple"),
    )
    out = fold_pads(p, registry)
    assert kernels(out) == ["convolution", "convolution"]
    assert all(line.args[0] == Ref("x") and line.args[4] == (0, 0) for line in out.body[:2])


@pytest.mark.parametrize(
    ("pads", "value"),
    [
        ((0, 1, 0, 1), 0.0),  # asymmetric: ATen's convolution pads symmetrically
        ((1, 1, 1, 1), 1.0),  # not zeros
        ((1, 1, 1, 1), -0.0),  # the sign of a zero sum could differ
        ((-1, -1, 0, 0), 0.0),  # a crop
    ],
)
def test_pads_a_convolution_cannot_absorb_stay(registry, pads: tuple[int, ...], value: float) -> None:
    shape = (1, 8, 10 + pads[2] + pads[3], 10 + pads[0] + pads[1])
    p = program(pad("x", "p", pads, shape, value), conv("p", "c", (1, 8, 8, 8)), Return((Ref("c"),), "single"))
    assert fold_pads(p, registry) == p


def test_a_pad_read_elsewhere_stays(registry) -> None:
    padded = pad("x", "p", (1, 1, 1, 1), (1, 8, 12, 12))
    returned = program(padded, conv("p", "c", (1, 8, 10, 10)), Return((Ref("c"), Ref("p")), "tuple"))
    assert fold_pads(returned, registry) == returned
    relu = KernelCall("relu", (Ref("p"),), (), (Value("r", cpu(1, 8, 12, 12)),), "r", "aten.relu")
    read_by_relu = program(padded, conv("p", "c", (1, 8, 10, 10)), relu, Return((Ref("c"), Ref("r")), "tuple"))
    assert fold_pads(read_by_relu, registry) == read_by_relu
    as_weight = program(padded, conv("x", "c", (1, 8, 8, 8), weight="p"), Return((Ref("c"),), "single"))
    assert fold_pads(as_weight, registry) == as_weight


@needs_onednn
def test_depthwise_convolutions_are_packed_at_any_size_and_pads_join_the_region(registry) -> None:
    p = program(
        conv("x", "c1", (1, 8, 10, 10), padding=(1, 1), groups=8),  # 7200 multiply-adds, far below MIN_MACS
        pad("c1", "p", (0, 1, 0, 1), (1, 8, 11, 11)),
        conv("p", "c2", (1, 8, 9, 9), groups=8),
        Return((Ref("c2"),), "single"),
        weight=(8, 1, 3, 3),
    )
    out = fuse_onednn(p, registry)
    assert [line.kernel for line in out.setup] == [PACK, PACK]  # one per input size
    assert kernels(out) == ["clone", CONV_UNARY, "constant_pad_nd", CONV_UNARY, "clone"]
    padded = out.body[2]
    assert padded.args[0] == Ref(out.body[1].outputs[0].name)  # reads the channels-last value: no copy between
    assert padded.outputs[0].meta.stride == channels_last_strides((1, 8, 11, 11))


@needs_onednn
def test_grouped_1x1_convolutions_below_the_threshold_stay_with_aten(registry) -> None:
    p = program(conv("x", "c", (1, 8, 10, 10), groups=8), Return((Ref("c"),), "single"), weight=(8, 1, 1, 1))
    assert fuse_onednn(p, registry) == p


class PadConv(nn.Module):
    def __init__(self, pads: tuple[int, ...], stride: int, groups: int, padding: int = 0) -> None:
        super().__init__()
        self.pads = pads
        self.conv = nn.Conv2d(16, 16, 3, stride=stride, padding=padding, groups=groups)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu6(self.bn(self.conv(F.pad(x, self.pads))))


def compile_and_compare(model: nn.Module, x: torch.Tensor) -> str:
    with torch.no_grad():
        model.eval()
        compiled = opgen.compile(model, (x,), cache=False)
        for _ in range(2):  # the second call reuses persistent buffers
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    return compiled.artifact.source


@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 1, 1, 1), (2, 2, 0, 0), (1, 1), (0, 1, 0, 1), (1, 2, 0, 1)])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("groups", [1, 16])
@pytest.mark.parametrize("size", [15, 16])
def test_padded_convolutions_match_eager(pads: tuple[int, ...], stride: int, groups: int, size: int) -> None:
    torch.manual_seed(0)
    model = PadConv(pads, stride, groups, padding=1 if pads == (2, 2, 0, 0) else 0)
    source = compile_and_compare(model, torch.randn(1, 16, size, size))
    symmetric = all(pads[i] == pads[i + 1] for i in range(0, len(pads), 2))
    assert ("constant_pad_nd(" in source) is not symmetric


class TfSame(nn.Module):
    """Hugging Face MobileNetV2's block: TF "SAME" pads before a 1x1 expand, a depthwise 3x3 and a 1x1 project."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.expand = nn.Conv2d(8, 32, 1)
        self.depthwise = nn.Conv2d(32, 32, 3, stride=stride, groups=32)
        self.project = nn.Conv2d(32, 8, 1)
        self.stride = stride

    @staticmethod
    def same(x: torch.Tensor, stride: int) -> torch.Tensor:
        total = [max(3 - (s % stride if s % stride else stride), 0) for s in x.shape[-2:]]
        return F.pad(x, (total[1] // 2, total[1] - total[1] // 2, total[0] // 2, total[0] - total[0] // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self.expand(F.pad(x, (0, 0, 0, 0))))
        h = F.relu6(self.depthwise(self.same(h, self.stride)))
        h = self.project(F.pad(h, (0, 0, 0, 0)))
        return h + x if self.stride == 1 else h


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("size", [9, 12, 33])
def test_tensorflow_same_padding_blocks_match_eager(stride: int, size: int) -> None:
    torch.manual_seed(0)
    source = compile_and_compare(TfSame(stride), torch.randn(1, 8, size, size))
    body = source[source.index("def forward(") : source.index("def forward_profiled")]
    assert body.count("constant_pad_nd(") == (stride == 2 and size % 2 == 0)  # only the asymmetric pad stays


def test_the_pass_is_optional() -> None:
    torch.manual_seed(0)
    model, x = PadConv((1, 1, 1, 1), 1, 16).eval(), torch.randn(1, 16, 12, 12)
    passes = tuple(p for p in pipeline.default_pipeline() if p != "pads")
    with torch.no_grad():
        compiled = opgen.compile(model, (x,), passes=passes, cache=False)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert "constant_pad_nd(" in compiled.artifact.source


def relu(x: str, out: str, meta: TensorMeta) -> KernelCall:
    return KernelCall("relu", (Ref(x),), (), (Value(out, meta),), out, "aten.relu")


def test_an_empty_pad_is_its_source(registry) -> None:
    p = program(pad("x", "p", (0, 0, 0, 0), (1, 8, 10, 10)), relu("p", "r", cpu(1, 8, 10, 10)), Return((Ref("r"),)))
    folded = fold_pads(p, registry)
    assert kernels(folded) == ["relu"] and folded.body[0].args == (Ref("x"),)  # type: ignore[union-attr]


def test_an_empty_pad_stays_where_it_copies_or_is_returned(registry) -> None:
    permuted = TensorMeta((1, 8, 10, 10), (800, 1, 80, 8), "float32", "cpu")  # the pad's result is contiguous
    layouts = Program("forward", (Input("x", permuted),), (), (), (
        pad("x", "p", (0, 0), (1, 8, 10, 10)), relu("p", "r", cpu(1, 8, 10, 10)), Return((Ref("r"),)),
    ))  # fmt: skip
    returned = program(pad("x", "p", (0, 0), (1, 8, 10, 10)), Return((Ref("p"),)))
    for p in (layouts, returned):
        assert kernels(fold_pads(p, registry)) == kernels(p)


class WindowPad(nn.Module):
    """Swin's window partition pads to a multiple of the window: by nothing at these sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(torch.relu(x), (0, 0, 0, 0, 0, 0)).view(2, 2, 2, 2, 2, 3).permute(0, 1, 3, 2, 4, 5).reshape(-1, 3)


def test_an_empty_pad_leaves_the_compiled_program() -> None:
    model, x = WindowPad(), torch.randn(2, 4, 4, 3)
    fn = opgen.compile(model, (x,), cache=False)
    assert "constant_pad_nd" not in fn.artifact.source  # type: ignore[attr-defined]
    torch.testing.assert_close(fn(x), model(x))
