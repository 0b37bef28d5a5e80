"""`--leave-out PASS ...` for the benchmarks that compile a decode step (`step`, `plan`): the default pipeline
without the named passes, for an A/B of a pass: two runs that differ by it. `opgen.compile`'s cache key holds
its `passes=`, so the two sides never share a compiled program (a table patched at run time would: the key
hashes opgen's source, not the table)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--leave-out", nargs="+", default=[], metavar="PASS",
                        help="compile without these passes of the default pipeline (an A/B of a pass)")  # fmt: skip


def check(parser: argparse.ArgumentParser, leave_out: Sequence[str]) -> None:
    """A name that is no pass is the parser's error."""
    from opgen.runtime.passes import PASSES

    if unknown := [name for name in leave_out if name not in PASSES]:
        parser.error(f"--leave-out: no pass named {', '.join(map(repr, unknown))} (passes: {', '.join(PASSES)})")


def pipeline(base: Sequence[str], leave_out: Sequence[str]) -> tuple[str, ...]:
    return tuple(name for name in base if name not in leave_out)


def without(leave_out: Sequence[str]) -> str:
    """The reports' note of what was left out ("" for nothing)."""
    return f", without {', '.join(leave_out)}" if leave_out else ""
