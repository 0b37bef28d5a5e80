"""opgen's own oneDNN kernels (`kernel_ops.mkldnn_*`, ops.yaml) against torch.ops.mkldnn, on CPU.

They call torch's at::native oneDNN functions directly; torch.ops.mkldnn reaches the same functions
through the dispatcher. Each case runs both on the same inputs, with plain and packed weights.
"""

from __future__ import annotations

import pytest
import torch

from opgen import kernel_ops

MKLDNN = torch.ops.mkldnn
pytestmark = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and hasattr(MKLDNN, "_convolution_pointwise")),
    reason="torch without oneDNN's fused kernels",
)
# (attr, scalars, algorithm) of unary post-ops, as the onednn pass passes them
UNARY = [
    ("none", (), ""),
    ("relu", (), ""),
    ("gelu", (), "tanh"),
    ("swish", (), ""),
    ("leaky_relu", (0.1,), ""),
    ("hardtanh", (-0.5, 0.5), ""),
]


def conv_case(packed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 8, 12, 12), torch.randn(16, 4, 3, 3), torch.randn(16)
    geometry = ((1, 1), (2, 2), (1, 1), 2)  # padding, stride, dilation, groups
    if packed:
        padding, stride, dilation, groups = geometry
        w = MKLDNN._reorder_convolution_weight(w, padding, stride, dilation, groups, list(x.shape))
    return x, w, b, geometry


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize(("attr", "scalars", "algorithm"), UNARY, ids=[u[0] for u in UNARY])
def test_convolution_pointwise(packed: bool, attr: str, scalars: tuple, algorithm: str) -> None:
    x, w, b, geometry = conv_case(packed)
    got = kernel_ops.mkldnn_convolution_pointwise(x, w, b, *geometry, attr, scalars, algorithm)
    expected = MKLDNN._convolution_pointwise(x, w, b, *geometry, attr, list(scalars), algorithm)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("unary", [None, "relu"])
def test_convolution_pointwise_binary(packed: bool, unary: str | None) -> None:
    x, w, b, geometry = conv_case(packed)
    z = torch.randn(2, 16, 6, 6)
    got = kernel_ops.mkldnn_convolution_pointwise_binary(x, z, w, b, *geometry, "add", 1.0, unary, (), "")
    expected = MKLDNN._convolution_pointwise.binary(x, z, w, b, *geometry, "add", 1.0, unary, [], "")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    plain = torch.nn.functional.conv2d(x, conv_case(False)[1], b, 2, 1, 1, 2) + z
    torch.testing.assert_close(got, plain.relu() if unary else plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize(("attr", "scalars", "algorithm"), UNARY, ids=[u[0] for u in UNARY])
def test_linear_pointwise(packed: bool, attr: str, scalars: tuple, algorithm: str) -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)
    w = MKLDNN._reorder_linear_weight(w, 16) if packed else w
    got = kernel_ops.mkldnn_linear_pointwise(x, w, b, attr, scalars, algorithm)
    expected = MKLDNN._linear_pointwise(x, w, b, attr, list(scalars), algorithm)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_linear_pointwise_binary(packed: bool) -> None:
    torch.manual_seed(0)
    x, w, b, z = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24), torch.randn(16, 24)
    plain = torch.nn.functional.linear(x, w, b) + z
    w = MKLDNN._reorder_linear_weight(w, 16) if packed else w
    got = kernel_ops.mkldnn_linear_pointwise_binary(x, z, w, b, "add")
    torch.testing.assert_close(got, MKLDNN._linear_pointwise.binary(x, z, w, b, "add"), rtol=0, atol=0)
    torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")
@pytest.mark.parametrize("rows", [16, 5], ids=["packed_rows", "other_rows"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_mkl_linear(rows: int, bias: bool) -> None:
    """MKL's packed product for the rows the weight was packed for (a 3-d input too); a plain one for others."""
    torch.manual_seed(0)
    w, b = torch.randn(24, 32), torch.randn(24) if bias else None
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 16)
    assert packed.layout == torch._mkldnn  # type: ignore[attr-defined]
    for x in (torch.randn(rows, 32), torch.randn(1, rows, 32)):
        got = kernel_ops.mkl_linear(x, packed, w, b, 16)
        torch.testing.assert_close(got, torch.ops.mkl._mkl_linear(x, packed, w, b, 16), rtol=0, atol=0)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="argument 'ORI_W' must be a strided"):
        kernel_ops.mkl_linear(x, packed, packed, b, 16)


def test_opaque_only_where_the_spec_allows_it() -> None:
    """A packed (mkldnn-layout) tensor passes as W, and is refused as X like by every other function."""
    _x, w, b, geometry = conv_case(True)
    assert w.layout == torch._mkldnn  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="argument 'X' must be a strided"):
        kernel_ops.mkldnn_convolution_pointwise(w, w, b, *geometry, "none", (), "")
    with pytest.raises(TypeError, match="argument 'self' must be a strided"):
        kernel_ops.relu(w)
    info = kernel_ops.get_kernel_ops_args_info()
    assert info["mkldnn_convolution_pointwise"]["opaque"] == ["W"] and info["relu"]["opaque"] == []


@pytest.mark.parametrize(
    "call",
    [
        lambda x, w, b: kernel_ops.mkldnn_linear_pointwise(x, w, b, "no_such_attr", (), ""),
        lambda x, w, b: kernel_ops.mkldnn_linear_pointwise(x[:, :5], w, b, "none", (), ""),
        lambda x, w, b: kernel_ops.mkldnn_linear_pointwise(x, w, b[:3], "none", (), ""),
        lambda x, w, b: kernel_ops.mkldnn_linear_pointwise(x.double(), w, b, "none", (), ""),
        lambda x, w, b: kernel_ops.mkldnn_linear_pointwise_binary(x, x, w, b, "add"),
    ],
    ids=["unknown_attr", "short_rows", "short_bias", "dtype_mismatch", "binary_shape_mismatch"],
)
def test_bad_arguments_raise(call) -> None:
    """Checked by torch's functions themselves: an exception, never a crash (checked in a child by the fuzz)."""
    torch.manual_seed(0)
    with pytest.raises((RuntimeError, ValueError, TypeError)):
        call(torch.randn(16, 32), torch.randn(24, 32), torch.randn(24))


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_binary_other_of_the_wrong_shape_or_layout_is_a_value_error(packed: bool) -> None:
    """oneDNN reads `other` as the result's shape (a short one past its end): the spec's checks refuse it."""
    x, w, b, geometry = conv_case(packed)
    result = kernel_ops.mkldnn_convolution_pointwise(x, w, b, *geometry, "none", (), "")
    with pytest.raises(ValueError, match=r"must have the result's shape \[2, 16, 6, 6\], not \[2, 16, 6\]"):
        kernel_ops.mkldnn_convolution_pointwise_binary(x, result[..., 0], w, b, *geometry, "add", None, None, (), None)
    strided = torch.randn(2, 16, 6, 12)[..., ::2]
    with pytest.raises(ValueError, match="must be dense"):
        kernel_ops.mkldnn_convolution_pointwise_binary(x, strided, w, b, *geometry, "add", None, None, (), None)
    with pytest.raises(ValueError, match=r"result's shape \[16, 24\], not \[16, 32\]"):
        kernel_ops.mkldnn_linear_pointwise_binary(
            torch.randn(16, 32), torch.randn(16, 32), torch.randn(24, 32), None, "add"
        )
    assert kernel_ops.get_kernel_ops_args_info()["mkldnn_linear_pointwise_binary"]["checks"] == ["linear_binary_other"]
