"""Picks forced from the environment: for tests, and for timing one pick against another inside a whole
program. The first call's timings time each call alone, and a chain of kernels can disagree with them
(`docs/jit-and-fusion.md`): forcing a pick and timing the whole step settles it.

- `OPGEN_FORCE_KERNEL`: comma-separated entries. A bare candidate name (`triton`, `aten`) forces every
  multi-kernel choice that has that candidate. `<kernel>=<candidate>` forces the choice of the kernel it
  names, and wins over a bare entry. A generated kernel is named by its Triton function, as profiles show
  it (`gemm_rows_17db97ce5632`), or by its local name in the program (`fused_3`).
- `OPGEN_FORCE_CONFIG`: comma-separated `<kernel>=<index>` entries. The JIT kernel of that Triton function
  runs its config `<index>`, counting from 0 in the order of its configs, without tuning. That config's
  pick is not cached.

A malformed entry, a candidate the named choice lacks, or an index out of range is a ValueError.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence


def _entries(variable: str) -> list[tuple[str | None, str]]:
    """(kernel or None, value) for each entry of `variable`."""
    found: list[tuple[str | None, str]] = []
    for raw in os.environ.get(variable, "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        kernel, sep, value = entry.partition("=")
        if not sep:
            found.append((None, entry))
        elif kernel.strip() and value.strip():
            found.append((kernel.strip(), value.strip()))
        else:
            raise ValueError(f"{variable}: entry {entry!r} is not <kernel>=<value>")
    return found


def forced_candidate(names: Sequence[str], candidates: Collection[str]) -> str | None:
    """The candidate `OPGEN_FORCE_KERNEL` forces on the choice known by `names`, or None. An entry naming
    one of `names` comes first. A bare entry applies only where it is one of `candidates`: it may name
    another choice's candidate."""
    bare: str | None = None
    for kernel, value in _entries("OPGEN_FORCE_KERNEL"):
        if kernel is None:
            if bare is None and value in candidates:
                bare = value
        elif kernel in names:
            if value not in candidates:
                raise ValueError(
                    f"OPGEN_FORCE_KERNEL: {kernel}={value}: {value!r} is not a candidate ({', '.join(candidates)})"
                )
            return value
    return bare


def forced_config(kernel: str, count: int) -> int | None:
    """The config index `OPGEN_FORCE_CONFIG` forces on the JIT kernel `kernel` (of `count` configs), or None."""
    for named, value in _entries("OPGEN_FORCE_CONFIG"):
        if named is None:
            raise ValueError(f"OPGEN_FORCE_CONFIG: entry {value!r} is not <kernel>=<index>")
        if named != kernel:
            continue
        if not value.isdigit() or int(value) >= count:
            raise ValueError(f"OPGEN_FORCE_CONFIG: {named}={value}: {kernel} has configs 0 to {count - 1}")
        return int(value)
    return None
