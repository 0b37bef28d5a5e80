"""Questions to ATen about this machine, asked once per process, answered as plain data for the passes
(`opgen.runtime.registry.DeviceFacts`), which import no torch."""

from __future__ import annotations

import functools
import os

import torch

from opgen.runtime.registry import DeviceFacts

FLASH, CUDNN = 1, 3  # torch.nn.attention.SDPBackend: the fused kernels that read grouped key/value heads


@functools.cache
def device_facts() -> DeviceFacts:
    if not torch.cuda.is_available():
        return DeviceFacts()
    return DeviceFacts(grouped_attention=_grouped_attention(), dependent_launch=_dependent_launch())


def _dependent_launch() -> bool:
    """Programmatic dependent launch: Hopper (compute capability 9.0) and newer, a Triton with the
    griddepcontrol intrinsics, and not turned off with OPGEN_DEPENDENT_LAUNCH=0."""
    if os.environ.get("OPGEN_DEPENDENT_LAUNCH", "1") == "0" or torch.cuda.get_device_capability() < (9, 0):
        return False
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True


def _grouped_attention() -> tuple[tuple[str, bool], ...]:
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
    return tuple(sorted(found))
