"""How a captured graph's outputs reach the caller: a plan per output leaf for the C++ runner.

An output the capture allocated in the graph's pool is copied into a fresh tensor each replay (or,
with `static_outputs`, returned as it is); a view of another output becomes a view of that one's
copy; an output that views an input the runner copies in becomes a view of the caller's tensor; any
other object (a constant, an input used in place) is returned as it was. See GraphRunner in
csrc/opgen/graphs/cuda_graph.cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opgen.runtime.errors import CaptureRefused


def pool_ranges(handle: Any) -> list[tuple[int, int]]:
    """Address ranges of the segments of a graph memory pool (what the captured graph allocated)."""
    wanted = tuple(handle)
    return [
        (s["address"], s["address"] + s["total_size"])
        for s in torch.cuda.memory_snapshot()
        if tuple(s.get("segment_pool_id", ())) == wanted
    ]


def _dense(t: torch.Tensor) -> bool:
    """Whether the elements fill a range of memory exactly once (some permutation of contiguous)."""
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """Element offsets [first, last + 1) a tensor reaches in its storage."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else -1
    return t.storage_offset(), t.storage_offset() + last + 1


def output_plans(
    leaves: Sequence[Any],
    statics: Sequence[torch.Tensor],
    fixed: frozenset[int],
    ranges: Sequence[tuple[int, int]],
    static_outputs: bool,
) -> list[tuple[Any, ...]]:
    """How the runner produces each output leaf (see GraphRunner in csrc/opgen/graphs/cuda_graph.cpp)."""
    by_storage = {s.untyped_storage().data_ptr(): i for i, s in enumerate(statics) if i not in fixed}
    in_pool = [
        isinstance(x, torch.Tensor) and any(lo <= x.untyped_storage().data_ptr() < hi for lo, hi in ranges)
        for x in leaves
    ]
    plans: list[tuple[Any, ...]] = []
    bases: dict[int, int] = {}  # storage -> the fresh output that copies it
    for i, leaf in enumerate(leaves):
        storage = leaf.untyped_storage().data_ptr() if isinstance(leaf, torch.Tensor) else None
        if storage is not None and storage in by_storage:
            base = statics[by_storage[storage]]
            if leaf.dtype != base.dtype:
                raise CaptureRefused("an output views an input as another dtype")
            offset = leaf.storage_offset() - base.storage_offset()
            plans.append(("input_view", by_storage[storage], tuple(leaf.shape), leaf.stride(), offset))
        elif storage is None or static_outputs or not in_pool[i]:
            plans.append(("object", leaf))
        else:
            plans.append(_fresh_plan(i, leaves, in_pool, bases))
    return plans


def _fresh_plan(i: int, leaves: Sequence[Any], in_pool: Sequence[bool], bases: dict[int, int]) -> tuple[Any, ...]:
    """A copied output, or a view of the copy of another output whose memory covers it."""
    leaf = leaves[i]
    storage = leaf.untyped_storage().data_ptr()
    sharing = [j for j, x in enumerate(leaves) if in_pool[j] and x.untyped_storage().data_ptr() == storage]
    if storage not in bases:
        covering = [j for j in sharing if _dense(leaves[j]) and _covers(leaves[j], [leaves[k] for k in sharing])]
        if not covering:
            raise CaptureRefused("outputs share memory in a way per-output copies cannot reproduce")
        bases[storage] = covering[0]
    base = bases[storage]
    if base == i:
        return ("fresh", leaf)
    return ("fresh_view", base, tuple(leaf.shape), leaf.stride(), leaf.storage_offset() - leaves[base].storage_offset())


def _covers(base: torch.Tensor, others: Sequence[torch.Tensor]) -> bool:
    lo, hi = _extent(base)
    return all(t.dtype == base.dtype and lo <= _extent(t)[0] and _extent(t)[1] <= hi for t in others)
