"""The JIT's disk cache, under OPGEN_CACHE_DIR/jit, and the counters that show what it saved.

Binaries are keyed by the kernel's source (Triton's `cache_key`, which covers the functions it
calls), its specialization (parameter types, alignment, divisibility, constexprs), the launch
options, and the GPU architecture and Triton/CUDA/driver versions. Autotune and multi-kernel picks
are small JSON files keyed the same way plus the argument sizes. Every entry carries a checksum:
one that is truncated, corrupt, or for another key is counted as `rebuilt` and replaced, never
loaded. Writes are atomic (a temporary file renamed into place), so concurrent writers never leave
a torn file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from opgen.disk import cache_dir, write_atomic
from opgen.jit.binary import KernelBinary


@dataclass
class Stats:
    """Process-wide counters (what `opgen.jit.stats()` returns)."""

    compiles: int = 0  # binaries compiled
    cache_hits: int = 0  # binaries loaded from disk
    rebuilt: int = 0  # damaged or stale entries detected and replaced
    tunes: int = 0  # autotune benchmarks run
    tune_hits: int = 0  # autotune picks loaded from disk
    choices: int = 0  # multi-kernel benchmarks run
    choice_hits: int = 0  # multi-kernel picks loaded from disk
    compile_seconds: float = 0.0
    tune_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, amount: float = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lock"}

    def reset(self) -> None:
        with self.lock:
            for f in fields(self):
                if f.name != "lock":
                    setattr(self, f.name, f.default)


STATS = Stats()  # one per process, like the cache it counts


def jit_dir() -> Path:
    return cache_dir() / "jit"


def make_key(parts: Iterable[Any]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _path(key: str, suffix: str) -> Path:
    return jit_dir() / key[:2] / f"{key}{suffix}"


def load_binary(key: str) -> KernelBinary | None:
    path = _path(key, ".bin")
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        binary = KernelBinary.from_bytes(data, key)
    except (ValueError, KeyError, TypeError):  # json errors are ValueErrors
        STATS.add("rebuilt")
        return None
    STATS.add("cache_hits")
    return binary


def store_binary(binary: KernelBinary) -> None:
    _store(_path(binary.key, ".bin"), binary.to_bytes())


def load_pick(key: str) -> dict[str, Any] | None:
    """A stored autotune or multi-kernel pick; None when absent or damaged."""
    path = _path(key, ".json")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        digest, _, body = text.partition("\n")
        if digest != hashlib.sha256(body.encode()).hexdigest():
            raise ValueError("checksum")
        record = json.loads(body)
        if record.get("key") != key:
            raise ValueError("key")
    except (ValueError, AttributeError):
        STATS.add("rebuilt")
        return None
    return record  # type: ignore[no-any-return]


def store_pick(key: str, record: dict[str, Any]) -> None:
    body = json.dumps({**record, "key": key}, sort_keys=True)
    _store(_path(key, ".json"), f"{hashlib.sha256(body.encode()).hexdigest()}\n{body}".encode())


def _store(path: Path, data: bytes) -> None:
    """A cache that cannot be written is skipped, never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
    except OSError:
        pass
