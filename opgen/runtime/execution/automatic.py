"""Automatic dynamic shapes: which dimensions to recompile as dynamic after a call with new sizes.

As torch.compile does: the first compile is static; the first call whose sizes differ from it
marks every dimension that differs (in any call so far) dynamic and compiles once more. Export is
asked first for a hard `Dim` of range [1, inf) per such dimension, so one function also serves
size 1; if the model's code does not allow that (export's constraint error), a soft
`Dim.DYNAMIC`, whose range export may start at 2 (its 0/1 specialization).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import Dim


@dataclass
class Dynamic:
    explicit: Any  # the user's dynamic_shapes (None: none given)
    automatic: bool  # recompile changed dimensions as dynamic
    first: tuple[tuple[int, ...], ...] | None = None  # the sizes of the first compile
    examples: list[tuple[torch.Tensor, ...]] = field(default_factory=list)  # empty tensors like past inputs
    dims: set[tuple[int, int]] = field(default_factory=set)  # (input, dimension) marked dynamic so far
    tried: set[frozenset[tuple[int, int]]] = field(default_factory=set)  # dimension sets compiled dynamic

    def seen(self, inputs: tuple[torch.Tensor, ...]) -> None:
        if self.first is None:
            self.first = tuple(tuple(t.shape) for t in inputs)
        self.examples.append(tuple(_like(t) for t in inputs))

    def example(self, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Inputs to export with: `args`, unless a dynamic dimension is 1 there (export would keep it static)."""
        for candidate in (args, *reversed(self.examples)):
            if all(candidate[i].shape[d] >= 2 for i, d in self.dims):
                return candidate
        return args

    def candidates(self, args: tuple[torch.Tensor, ...], module: torch.nn.Module) -> Iterator[Any]:
        """dynamic_shapes to try for `args`, best first (none: compile them statically)."""
        if not self.automatic or self.first is None or len(args) != len(self.first):
            return
        if any(not isinstance(a, torch.Tensor) or a.dim() != len(s) for a, s in zip(args, self.first, strict=True)):
            return
        changed = {(i, d) for i, (a, s) in enumerate(zip(args, self.first, strict=True)) for d in range(len(s))
                   if a.shape[d] != s[d]}  # fmt: skip
        if not changed:
            return
        self.dims |= changed
        if frozenset(self.dims) in self.tried:  # that function exists and does not take these sizes
            return
        self.tried.add(frozenset(self.dims))
        yield self._shapes(len(args), lambda i, d: Dim(f"input{i}_dim{d}", min=1))
        yield self._shapes(len(args), lambda i, d: Dim.DYNAMIC)

    def _shapes(self, count: int, make: Any) -> tuple[dict[int, Any] | None, ...]:
        return tuple({d: make(i, d) for j, d in sorted(self.dims) if j == i} or None for i in range(count))


def _like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of the same sizes, strides, dtype and device (export reads only those)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
