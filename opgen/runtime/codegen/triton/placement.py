"""Addresses of outputs a fused kernel stores where a chain of data movements puts them
(`opgen.runtime.passes.fusion.placement` finds the chains; an output's `Placement` holds its moves).

An element's coordinates in the group's value are carried through the moves (a reshape re-reads the
row-major index, a permute reorders coordinates, a roll adds its shift modulo the size), and the
store's address is the last coordinates times the output's strides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opgen.runtime.ir import Move, Placement, TensorMeta, contiguous_strides


@dataclass(frozen=True, slots=True)
class Index:
    """An element's place in a tensor of `shape`, as Triton expressions: its row-major `linear` index,
    its `coords`, or both (each computed from the other when asked)."""

    shape: tuple[int, ...]
    linear: str | None = None
    coords: tuple[str, ...] | None = None

    def coordinates(self) -> tuple[str, ...]:
        if self.coords is not None:
            return self.coords
        assert self.linear is not None
        inner = contiguous_strides(self.shape)
        return tuple("0" if n == 1 else _div_mod(self.linear, s, n, first=d == 0) for d, (n, s) in
                     enumerate(zip(self.shape, inner, strict=True)))  # fmt: skip

    def row_major(self) -> str:
        if self.linear is not None:
            return self.linear
        return _dot(self.coordinates(), contiguous_strides(self.shape), self.shape)

    def moved(self, move: Move) -> Index:
        kind, a, b = move
        if kind == "reshape":
            return Index(a, linear=self.row_major())
        coords = self.coordinates()
        if kind == "permute":
            return Index(tuple(self.shape[d] for d in a), coords=tuple(coords[d] for d in a))
        rolled = list(coords)
        for shift, d in zip(a, b, strict=True):
            if shift % self.shape[d]:
                rolled[d] = f"({coords[d]} + {shift % self.shape[d]}) % {self.shape[d]}"
        return Index(self.shape, coords=tuple(rolled))

    def offset(self, meta: TensorMeta) -> str:
        """The address of the element in a tensor of this shape with `meta`'s strides."""
        strides = tuple(int(s) for s in meta.stride)  # type: ignore[arg-type]
        if self.linear is not None and strides == contiguous_strides(self.shape):
            return self.linear
        return _dot(self.coordinates(), strides, self.shape) or "0"


def placed_address(start: Index, placement: Placement, meta: TensorMeta) -> str:
    """Where the output `meta` holds the element of the group's value at `start`."""
    index = start
    for move in placement.moves:
        index = index.moved(move)
    assert index.shape == tuple(meta.shape), (index.shape, meta.shape)
    return index.offset(meta)


def _div_mod(index: str, inner: int, size: int, first: bool) -> str:
    text = index if inner == 1 else f"({index}) // {inner}"
    return text if first else f"({text}) % {size}"


def _dot(coords: Sequence[str], strides: Sequence[int], shape: Sequence[int]) -> str:
    terms = [c if s == 1 else f"({c}) * {s}" for c, s, n in zip(coords, strides, shape, strict=True) if n != 1 and s]
    return " + ".join(terms)
