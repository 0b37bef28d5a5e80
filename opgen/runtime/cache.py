"""The disk cache of compiled graphs, under OPGEN_CACHE_DIR (default ~/.cache/opgen).

Keys hash the graph (code, every node's meta, the signature), the options, the torch version,
`kernel_ops.BUILD_ID` and the runtime's own source, so a change to any of them misses. Entries
hold source and metadata only, never tensors: constants are bound from the live model. Writes go
to a temporary file renamed into place, so concurrent processes never read half an entry.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from opgen.runtime.artifact import CompiledGraph


def cache_dir() -> Path:
    return Path(os.environ.get("OPGEN_CACHE_DIR") or Path.home() / ".cache" / "opgen")


@functools.cache
def runtime_fingerprint() -> str:
    """A hash of the runtime's source: a changed code generator must not reuse old entries."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        digest.update(path.read_bytes())
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
        graph = CompiledGraph.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return graph if graph.key == key else None


def source_path(key: str) -> Path:
    return entry_dir(key) / "graph.py"


def store(graph: CompiledGraph) -> Path | None:
    """Write an entry; a cache that cannot be written is skipped, never an error."""
    folder = entry_dir(graph.key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / "graph.py", graph.source)
        _write(folder / "graph.json", graph.to_json())
    except OSError:
        return None
    return folder / "graph.py"


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
