"""Questions to ATen about this machine, asked once per process, answered as plain data for the passes
(`opgen.runtime.registry.DeviceFacts`), which import no torch."""

from __future__ import annotations

import functools

import torch

from opgen.runtime.registry import DeviceFacts

FLASH, CUDNN = 1, 3  # torch.nn.attention.SDPBackend: the fused kernels that read grouped key/value heads


@functools.cache
def device_facts() -> DeviceFacts:
    return DeviceFacts(grouped_attention=_grouped_attention()) if torch.cuda.is_available() else DeviceFacts()


def _grouped_attention() -> frozenset[tuple[str, bool]]:
    """Where `scaled_dot_product_attention(..., enable_gqa=True)` picks flash attention or cuDNN: asked of
    ATen's own choice (`_fused_sdp_choice`) for 8 query heads over 2 key/value heads, 64 positions of 64."""
    found = set()
    for dtype in (torch.float16, torch.bfloat16):
        q = torch.empty(1, 8, 64, 64, dtype=dtype, device="cuda")
        kv = torch.empty(1, 2, 64, 64, dtype=dtype, device="cuda")
        for masked in (False, True):
            mask = torch.zeros(1, 1, 64, 64, dtype=dtype, device="cuda") if masked else None
            try:
                choice = torch._fused_sdp_choice(q, kv, kv, mask, 0.0, False, scale=None, enable_gqa=True)  # type: ignore[attr-defined]
            except (RuntimeError, TypeError):
                continue
            if int(choice) in (FLASH, CUDNN):
                found.add((str(dtype).removeprefix("torch."), masked))
    return frozenset(found)
