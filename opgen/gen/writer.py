"""Write generated files, touching only those whose bytes change (so Ninja rebuilds nothing else)."""

from __future__ import annotations

from pathlib import Path


def write_files(out_dir: Path, files: dict[str, str]) -> list[str]:
    """Write each file under `out_dir`; return the relative paths that changed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for relpath, text in files.items():
        path = out_dir / relpath
        data = text.encode("utf-8")
        if path.exists() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        changed.append(relpath)
    return changed
