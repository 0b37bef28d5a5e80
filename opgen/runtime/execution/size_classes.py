"""Size classes: a dynamic range compiled as sub-ranges where a pass would choose differently in each.

A pass that can only decide per call over a whole range records the split that would let it decide
at compile time (`Program.splits`, kept in the artifact): `passes.prepack` runs a linear layer
through oneDNN from MIN_ROWS rows and through the plain product below, and over a range that
crosses MIN_ROWS it calls `linear_rows`, which picks per call and keeps the small sizes from what a
static specialization does with them (the product written into a persistent buffer, its views
taken once by the size memo). `opgen.compile` then compiles each sub-range of the one export
(no second export) and serves the range with those functions: each checks its own sub-range, and a
call in another goes through the slow path to the one that takes it (a microsecond or two).
`report().specializations` counts them as one compile.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from opgen.runtime.ir.sizes import SizeRange

MAX_CLASSES = 4  # more sub-ranges cost more compile time than the per-call choice they save


def _cuts(r: SizeRange, points: Sequence[int]) -> list[SizeRange]:
    """`r` cut before each point strictly inside it."""
    inside = sorted({p for p in points if r.low < p and (r.high is None or p <= r.high)})
    lows = [r.low, *inside]
    highs = [p - 1 for p in inside] + [r.high]
    return [SizeRange(r.symbol, lo, hi) for lo, hi in zip(lows, highs, strict=True)]


def sub_ranges(ranges: Sequence[SizeRange], splits: Sequence[tuple[str, int]]) -> list[tuple[SizeRange, ...]]:
    """Every combination of the ranges cut at the splits; just `[ranges]` when nothing is cut or too many."""
    per_symbol = [_cuts(r, [n for s, n in splits if s == r.symbol]) for r in ranges]
    classes = [tuple(c) for c in itertools.product(*per_symbol)]
    return classes if 1 < len(classes) <= MAX_CLASSES else [tuple(ranges)]
