"""Fixtures shared by the CPU and GPU test directories."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def cudnn_exact() -> Iterator[None]:
    """cuDNN without TF32: with it (torch's default) two equal convolutions may differ, and folding
    batch norm into ResNet-18's weights moves its logits by about 1e-2 instead of about 1e-5."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved
