"""The bytes of an opgen package file: what `opgen.package` writes and csrc/opgen/package/package.cpp reads.

A package is one file: a first line (`opgen-package <format> <header bytes> <header crc32c>`), a
header of text lines (versions, the model's name and output form, where the program and each
constant lie, with their sizes, strides and checksums) and, from the next 64-byte boundary, the
data: the executor program's text and the constants' raw bytes, each at a 64-byte aligned offset
from the data's start (the reader maps the file and uses the constants where they lie). C++ reads
it with libtorch only (no pickle, no JSON parser); csrc/opgen/package/package.h documents the lines.
Strings are %-escaped as in executor programs (`codegen.cpp_literals.escape`), so every line splits on spaces.
Checksums are CRC-32C: the caller passes the function (`_C.crc32c`, the reader's own).

Plain data and bytes, no torch: the tensors come in as `ConstantBytes` (frontend/packaging.py makes them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from opgen.runtime.codegen.cpp_literals import escape

FORMAT = 2  # csrc/opgen/package/package.h: kPackageFormat
MAGIC = "opgen-package"
ALIGN = 64  # kPackageAlign

Checksum = Callable[[bytes], int]  # CRC-32C of the bytes


@dataclass(frozen=True, slots=True)
class ConstantBytes:
    """One constant: its key (the program's `constant` line), dtype name, sizes, strides and the bytes of
    the storage span they cover from its first element."""

    key: str
    dtype: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    data: bytes


@dataclass(frozen=True, slots=True)
class PackageHeader:
    """What a package records besides its constants."""

    name: str  # the model's
    torch_version: str
    thunk_digest: str  # the thunks the program calls (opgen.gen.emit.thunk_digest; _C.THUNK_DIGEST)
    kernel_ops_build_id: str
    output_form: str  # single | tuple | list | pytree
    output_tree: str  # pytree: torch's treespec JSON; else ""
    program: str  # the C++ executor's program text
    # The extension modules whose kernels the program calls, with their thunk digests (module, digest):
    # `load_package` imports each first. The C++ reader skips the line; a C++ program has no such module.
    extensions: tuple[tuple[str, str], ...] = ()


def _ints(values: Sequence[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _word(text: str) -> str:
    return escape(text) if text else "-"


def encode(header: PackageHeader, constants: Sequence[ConstantBytes], crc32c: Checksum) -> Iterator[bytes]:
    """The file's bytes, in pieces (the constants' bytes are not copied into one buffer)."""
    program = header.program.encode()
    lines = [
        f"torch {_word(header.torch_version)}",
        f"thunks {_word(header.thunk_digest)}",
        f"kernel_ops {_word(header.kernel_ops_build_id)}",
        f"name {_word(header.name)}",
        f"output {header.output_form} {_word(header.output_tree)}",
        f"program 0 {len(program)} {crc32c(program):x}",
    ]
    if header.extensions:
        lines.append("extensions " + " ".join(f"{escape(m)}={escape(d)}" for m, d in header.extensions))
    pieces = [program]
    offset = len(program)
    for c in constants:
        start = _aligned(offset)
        pieces += [bytes(start - offset), c.data]
        offset = start + len(c.data)
        where = f"{start} {len(c.data)} {crc32c(c.data):x}"
        lines.append(f"constant {escape(c.key)} {c.dtype} {_ints(c.sizes)} {_ints(c.strides)} {where}")
    lines.append(f"data {offset}")
    yield _head("\n".join(lines) + "\n", crc32c)
    yield from pieces


def _head(text: str, crc32c: Checksum) -> bytes:
    """The first line and the header `text`, then zeros up to the data's 64-byte boundary."""
    body = text.encode()
    head = f"{MAGIC} {FORMAT} {len(body)} {crc32c(body):x}\n".encode() + body
    return head + bytes(_aligned(len(head)) - len(head))


def write(path: Path, header: PackageHeader, constants: Sequence[ConstantBytes], crc32c: Checksum) -> int:
    """Write the package to `path` through a temporary file renamed into place (a reader never sees half a
    package), piece by piece, with the permissions a new file gets (not a private temporary's); the bytes written.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    written = 0
    try:
        with open(tmp, "wb") as f:
            for piece in encode(header, constants, crc32c):
                written += f.write(piece)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk or an interrupt leaves no temporary file behind
        raise
    return written


def replace_header(data: bytes, crc32c: Checksum, **fields: str) -> bytes:
    """The package `data` with header lines replaced (`torch="1.0"`), checksums made right again; for
    tests and tools that need a package made elsewhere."""
    first, _, rest = data.partition(b"\n")
    _, _, length, _ = first.decode().split(" ")
    text = rest[: int(length)].decode()
    body = data[_aligned(len(first) + 1 + int(length)) :]
    lines = text.splitlines()
    for key, value in fields.items():
        lines = [f"{key} {escape(value)}" if line.split(" ", 1)[0] == key else line for line in lines]
    return _head("\n".join(lines) + "\n", crc32c) + body


def read_extensions(path: Path) -> tuple[tuple[str, str], ...]:
    """The `extensions` line of a package's header, (module, thunk digest) each, or () where it has none
    (or the file is no package: the C++ reader, which checks everything, says what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256).decode().split(" ")
            if len(first) != 4 or first[0] != MAGIC:
                return ()
            text = f.read(int(first[2])).decode()
    except (OSError, ValueError, UnicodeDecodeError):
        return ()
    for line in text.splitlines():
        words = line.split(" ")
        if words[0] == "extensions":
            pairs = (w.partition("=") for w in words[1:])
            return tuple((unquote(m), unquote(d)) for m, _, d in pairs)
    return ()
