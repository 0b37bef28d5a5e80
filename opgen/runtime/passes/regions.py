"""Regions of a tensor's storage as metas: the meta of a slice or select view, and containment.

Plain arithmetic on static `TensorMeta`s (symbolic ones are never contained and have no computed view).
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import TensorMeta


def within(inner: TensorMeta | None, outer: TensorMeta | None) -> bool:
    """Every element of `inner` is one of `outer` (the same view, or inside a dense `outer`'s range)."""
    if inner is None or outer is None or inner == outer:
        return inner is not None and inner == outer
    if not (inner.is_static and outer.is_static) or inner.dtype != outer.dtype or inner.numel == 0:
        return False
    if any(s < 0 for s in (*inner.stride, *outer.stride)) or not dense(outer):  # type: ignore[operator]
        return False
    return outer.offset <= inner.offset and inner.span <= outer.offset + outer.numel  # type: ignore[operator]


def dense(meta: TensorMeta) -> bool:
    """Every element of a static tensor's storage range once, in some order of its dims: each stride,
    smallest first, is the extent of the smaller ones (no gaps, no overlap)."""
    dims: list[tuple[int, int]] = sorted((s, n) for s, n in zip(meta.stride, meta.shape, strict=True) if n != 1)  # type: ignore[misc]
    step = 1
    for stride, n in dims:
        if stride != step:
            return False
        step *= n
    return True


def slice_meta(meta: TensorMeta, dim: int, start: int | None, end: int | None, step: int = 1) -> TensorMeta | None:
    """The meta of `slice(t, dim, start, end, step)` for a static `t`, as torch clamps the bounds."""
    if not -len(meta.shape) <= dim < len(meta.shape) or step is None or step < 1:
        return None
    d = dim % len(meta.shape)
    n: int = meta.shape[d]  # type: ignore[assignment]
    start = 0 if start is None else start + n if start < 0 else start
    end = n if end is None else end + n if end < 0 else end
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    shape, stride = list(meta.shape), list(meta.stride)
    shape[d], stride[d] = (end - start + step - 1) // step, stride[d] * step  # type: ignore[operator]
    return replace(meta, shape=tuple(shape), stride=tuple(stride), offset=meta.offset + start * meta.stride[d])  # type: ignore[operator]


def select_meta(meta: TensorMeta, dim: int, index: int) -> TensorMeta | None:
    if not -len(meta.shape) <= dim < len(meta.shape):
        return None
    d = dim % len(meta.shape)
    n: int = meta.shape[d]  # type: ignore[assignment]
    if not -n <= index < n:
        return None
    offset = meta.offset + (index % n) * meta.stride[d]  # type: ignore[operator]
    shape, stride = meta.shape[:d] + meta.shape[d + 1 :], meta.stride[:d] + meta.stride[d + 1 :]
    return replace(meta, shape=shape, stride=stride, offset=offset)
