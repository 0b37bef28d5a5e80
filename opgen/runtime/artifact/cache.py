"""The disk cache of compiled graphs, under OPGEN_CACHE_DIR (default ~/.cache/opgen).

Keys hash the graph (code, every node's meta, the signature), the options, the torch version,
`kernel_ops.BUILD_ID` and the runtime's own source (every module of `opgen.runtime` and of
`opgen.jit`, which writes the Triton kernels), so a change to any of them misses. Entries
hold source and metadata only, never tensors: constants are bound from the live model. Writes go
to a temporary file renamed into place, so concurrent processes never read half an entry. The
entry's first line is the SHA-256 of the rest: an entry that is truncated, corrupt, of another
format or for another key is a miss, so the graph is compiled again and the entry overwritten.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

from opgen.disk import cache_dir, write_atomic
from opgen.runtime.artifact.compiled import CompiledGraph

OPGEN = Path(__file__).resolve().parents[2]
FINGERPRINTED = (OPGEN / "runtime", OPGEN / "jit")  # the code that decides what a compiled graph holds


def fingerprinted_files() -> list[Path]:
    return sorted(path for folder in FINGERPRINTED for path in folder.rglob("*.py"))


@functools.cache
def runtime_fingerprint() -> str:
    """A hash of the runtime's source: a changed code generator or pass must not reuse old entries."""
    digest = hashlib.sha256()
    for path in fingerprinted_files():
        digest.update(path.relative_to(OPGEN).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in (runtime_fingerprint(), *parts):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def entry_dir(key: str) -> Path:
    return cache_dir() / key[:2] / key


def load(key: str) -> CompiledGraph | None:
    path = entry_dir(key) / "graph.json"
    try:
        digest, _, body = path.read_text(encoding="utf-8").partition("\n")
        if digest != _digest(body):
            return None
        graph = CompiledGraph.from_json(body)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # UnicodeDecodeError is a ValueError
        return None
    return graph if graph.key == key else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def source_path(key: str) -> Path:
    return entry_dir(key) / "graph.py"


def store(graph: CompiledGraph) -> Path | None:
    """Write an entry; a cache that cannot be written is skipped, never an error."""
    folder = entry_dir(graph.key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "graph.py", graph.source)
        body = graph.to_json()
        write_atomic(folder / "graph.json", f"{_digest(body)}\n{body}")
    except OSError:
        return None
    return folder / "graph.py"
