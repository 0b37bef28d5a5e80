"""Generated source in `linecache` for as long as a function compiled from it lives.

Tracebacks and debuggers read a compiled graph's lines from `linecache`. `hold` registers them when
a graph is bound; `release_with` ties them to the bound function, and the entry goes when the last
live function bound under that file name is freed. So a process that compiles and frees many graphs
does not keep their sources. (torch.fx's own `<eval_with_key>.N` entries, one per GraphModule that
torch.export makes, are torch's: it never removes them.)
"""

from __future__ import annotations

import linecache
import threading
import weakref
from typing import Any

# linecache is one global table; several threads bind graphs (first calls, specializations).
_LOCK = threading.Lock()


class _Lines(list[str]):
    """linecache's line list for one file name, counting the live functions bound from it."""

    __slots__ = ("owners",)
    owners: int


def hold(filename: str, source: str) -> _Lines:
    """Registers `source` under `filename` (or counts one more user of the same source there)."""
    lines = source.splitlines(keepends=True)
    with _LOCK:
        entry = linecache.cache.get(filename)
        held = entry[2] if entry is not None and len(entry) == 4 else None
        if isinstance(held, _Lines) and held == lines:
            held.owners += 1
            return held
        held = _Lines(lines)
        held.owners = 1
        linecache.cache[filename] = (len(source), None, held, filename)
        return held


def release_with(owner: Any, filename: str, held: _Lines) -> None:
    """When `owner` is freed, drops one user of `held`; the last one removes the entry."""
    weakref.finalize(owner, _release, filename, held)


def _release(filename: str, held: _Lines) -> None:
    with _LOCK:
        held.owners -= 1
        entry = linecache.cache.get(filename)
        if held.owners == 0 and entry is not None and entry[2] is held:
            del linecache.cache[filename]
