"""`--leave-out PASS ...` for the benchmarks that compile a decode step (`step`, `plan`): the command's pipeline
without the named passes, for an A/B of a pass: two runs that differ by it. `opgen.compile`'s cache key holds
its `passes=`, so the two sides never share a compiled program (a table patched at run time would: the key
hashes opgen's source, not the table)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--leave-out", nargs="+", default=[], metavar="PASS",
                        help="compile without these passes of the pipeline this command runs (an A/B)")  # fmt: skip


def check(parser: argparse.ArgumentParser, leave_out: Sequence[str], base: Sequence[str], jit_why: str = "") -> None:
    """A name that is no pass, or a pass that `base` (the pipeline the command runs, here) does not hold, is the
    parser's error: leaving out a pass that never runs would make an A/B of two equal runs. `jit_why` says why
    the JIT's passes are not in `base`, where they are not."""
    from opgen.runtime.passes import JIT_PASSES, PASSES

    if unknown := [name for name in leave_out if name not in PASSES]:
        parser.error(f"--leave-out: no pass named {_names(unknown)} (passes: {', '.join(PASSES)})")
    if idle := [name for name in leave_out if name not in base]:
        why = f" ({jit_why})" if jit_why and set(idle) <= JIT_PASSES else ""
        parser.error(
            f"--leave-out: {_names(idle)} {'is' if len(idle) == 1 else 'are'} not in the pipeline this command runs"
            f"{why}; it runs: {', '.join(dict.fromkeys(base))}"
        )


def pipeline(base: Sequence[str], leave_out: Sequence[str]) -> tuple[str, ...]:
    return tuple(name for name in base if name not in leave_out)


def without(leave_out: Sequence[str]) -> str:
    """The reports' note of what was left out ("" for nothing)."""
    return f", without {', '.join(leave_out)}" if leave_out else ""


def _names(names: Sequence[str]) -> str:
    return ", ".join(map(repr, names))
