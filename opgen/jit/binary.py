"""A compiled kernel as plain data: binary, entry point, launch metadata and specialization.

It knows nothing of how it is launched (that is the C++ launcher's job) and round-trips through
bytes, which is how the disk cache stores it: a magic line, a JSON header holding the SHA-256 of
the binary, then the binary. Anything that does not check out is a `ValueError`, never a load.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

_MAGIC = b"opgen-jit-binary 1\n"


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """How one runtime parameter was specialized. `kind`: ptr, i32, i64, u64, fp32, fp64, u1,
    const_one or const_none (an int equal to 1 or a None, baked into the binary)."""

    name: str
    kind: str
    dtype: str | None = None  # ptr: the torch dtype name ("float32")
    align16: bool = False  # ptr: compiled for 16-byte aligned data
    div16: bool = False  # ints: compiled for multiples of 16


@dataclass(frozen=True, slots=True)
class KernelBinary:
    key: str  # the cache key it was compiled under
    name: str  # the entry point
    cubin: bytes
    num_warps: int
    num_stages: int
    shared: int
    extra_pointers: int  # trailing null pointer arguments of Triton's ABI (scratch buffers)
    params: tuple[ParamSpec, ...]
    meta: tuple[tuple[str, Any], ...]  # the constexpr values
    arch: str

    def to_bytes(self) -> bytes:
        header = asdict(self)
        header.pop("cubin")
        header["cubin_sha256"] = hashlib.sha256(self.cubin).hexdigest()
        text = json.dumps(header, sort_keys=True).encode()
        return _MAGIC + len(text).to_bytes(8, "little") + text + self.cubin

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> KernelBinary:
        if not data.startswith(_MAGIC):
            raise ValueError("not an opgen JIT binary (or another format version)")
        start = len(_MAGIC) + 8
        size = int.from_bytes(data[len(_MAGIC) : start], "little")
        header = json.loads(data[start : start + size])
        cubin = data[start + size :]
        if header.pop("cubin_sha256") != hashlib.sha256(cubin).hexdigest():
            raise ValueError("the binary does not match its checksum (truncated or corrupt)")
        if header["key"] != key:
            raise ValueError("the entry holds another kernel")
        header["params"] = tuple(ParamSpec(**p) for p in header["params"])
        header["meta"] = tuple((k, v) for k, v in header["meta"])
        return cls(cubin=cubin, **header)
