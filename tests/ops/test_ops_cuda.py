"""Every kernel_ops function against eager PyTorch on CUDA, with the CPU samples moved to the GPU.

The same checks as test_ops_eager.py (values, dtype, shape, strides, storage offset, aliasing,
in-place and out identity). Each sample tensor moves to the GPU with its exact strides and storage
offset (its whole storage is copied), and factory functions (those with a `device` argument) are
asked for a CUDA tensor. Skipped without a GPU.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from typing import Any

import pytest
import samples
import torch
from test_ops_eager import INFO, OP_CASES, check_op

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("cudnn_exact"),
]


def to_cuda(value: Any, device: str) -> Any:
    """The same value on the GPU: tensors keep sizes, strides and storage offset; containers recurse."""
    if isinstance(value, torch.Tensor):
        elements = value.untyped_storage().nbytes() // value.element_size()
        storage = torch.as_strided(value, (elements,), (1,), 0).to(device)
        return storage.as_strided(value.shape, value.stride(), value.storage_offset())
    if isinstance(value, (list, tuple)):
        return type(value)(to_cuda(v, device) for v in value)
    return value


def on_cuda(name: str, device: str, sample: samples.Sample) -> samples.Sample:
    kwargs = {k: to_cuda(v, device) for k, v in sample.kwargs.items()}
    if any(a["name"] == "device" for a in INFO[name]["args"]):
        kwargs["device"] = torch.device(device)
    return samples.Sample(to_cuda(sample.args, device), kwargs, sample.variants)


@pytest.mark.parametrize(("name", "dtype"), OP_CASES)
def test_op_cuda(name: str, dtype: torch.dtype) -> None:
    check_op(name, dtype, "cuda", partial(on_cuda, name, "cuda"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize(("name", "dtype"), OP_CASES)
def test_op_second_gpu(name: str, dtype: torch.dtype) -> None:
    """Tensors on cuda:1 while cuda:0 is current: each kernel runs on its tensors' device."""
    torch.cuda.set_device(0)
    check_op(name, dtype, "cuda", partial(on_cuda, name, "cuda:1"))


def test_mixed_devices_are_a_clear_error() -> None:
    from opgen import kernel_ops

    with pytest.raises((RuntimeError, ValueError), match=r"kernel_ops\.add"):
        kernel_ops.add(torch.ones(3, device="cuda"), torch.ones(3))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_in_one_call_are_a_clear_error() -> None:
    from opgen import kernel_ops

    with pytest.raises(RuntimeError, match=r"kernel_ops\.add\(\): expected all tensors on one device"):
        kernel_ops.add(torch.ones(3, device="cuda:0"), torch.ones(3, device="cuda:1"))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 1000, 5000])
def test_triton_add_matches_add(dtype: torch.dtype, n: int) -> None:
    """The spec's Triton op against the ATen overload it is a candidate for (same arguments)."""
    from opgen import kernel_ops

    x, y = (torch.randn(n, device="cuda").to(dtype) for _ in range(2))
    for alpha in (1, 2.5, -1):
        torch.testing.assert_close(kernel_ops.triton_add(x, y, alpha=alpha), torch.add(x, y, alpha=alpha))


def test_triton_add_refuses_what_its_kernel_cannot_read() -> None:
    from opgen import kernel_ops

    x = torch.ones(4, 4, device="cuda")
    with pytest.raises(RuntimeError, match=r"^kernel_ops\.triton_add\(\): .*'other' is on cpu"):
        kernel_ops.triton_add(x, torch.ones(4, 4))
    with pytest.raises(RuntimeError, match=r"^kernel_ops\.triton_add\(\): argument 'self' is on cpu"):
        kernel_ops.triton_add(torch.ones(4, 4), torch.ones(4, 4))
    with pytest.raises(ValueError, match=r"^kernel_ops\.triton_add\(\): arguments 'self' \[4, 4\] and 'other' \[4\]"):
        kernel_ops.triton_add(x, torch.ones(4, device="cuda"))
    with pytest.raises(ValueError, match=r"^kernel_ops\.triton_add\(\): argument 'other' must be contiguous"):
        kernel_ops.triton_add(x, x.t())
