"""Device memory for the benchmarks: what is free before a model is built, and giving it back after."""

from __future__ import annotations

import gc

import torch


def free_memory(device: torch.device) -> None:
    """Collect Python's garbage and, on CUDA, return the caching allocator's unused blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def available_memory(device: torch.device) -> int | None:
    """Bytes free on `device`: the GPU's free memory, or the host's MemAvailable (None where unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
