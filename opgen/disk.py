"""opgen's place on disk (OPGEN_CACHE_DIR, default ~/.cache/opgen) and the one way it writes there.

Shared by the runtime's cache of compiled graphs and the JIT's cache of kernel binaries.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("OPGEN_CACHE_DIR") or Path.home() / ".cache" / "opgen")


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a temporary file renamed into place: readers see the old or the new file, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a full disk or an interrupt leaves no temporary file behind
        raise
