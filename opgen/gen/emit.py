"""The pure emitter: validated ops -> {relative path: file text}. No I/O, no clocks, no paths."""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import jinja2

from opgen.gen import bindings, registry, stub, thunks, user_kernels
from opgen.spec.model import OpSpec

DEFAULT_SHARDS = 4
DEFAULT_MODULE = "_C"

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent.parent / "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # noqa: S701 - C++ and Python source, not HTML
)


def shard_of(spec: OpSpec, shards: int) -> int:
    """Stable across machines and runs: a CRC of the op group's name (variants stay together)."""
    return zlib.crc32(spec.group.encode()) % shards


def output_names(shards: int = DEFAULT_SHARDS) -> list[str]:
    thunk_files = [f"thunks_{i}.cpp" for i in range(shards)] + ["thunk_tables.cpp"]
    return [f"kernel_ops_{i}.cpp" for i in range(shards)] + thunk_files + ["module.cpp", "kernel_ops.pyi"]


def emit(
    ops: tuple[OpSpec, ...], spec_name: str, shards: int = DEFAULT_SHARDS, module: str = DEFAULT_MODULE
) -> dict[str, str]:
    files: dict[str, str] = {}
    for shard in range(shards):
        members = [s for s in ops if shard_of(s, shards) == shard]
        common, cuda = bindings.headers(members)
        name = f"kernel_ops_{shard}.cpp"
        text = _TEMPLATES.get_template("shard.cpp.j2").render(
            spec_name=spec_name,
            shard=shard,
            shards=shards,
            headers=common,
            cuda_headers=cuda,
            user_includes="\n".join(user_kernels.include_lines(members)),
            functions=[bindings.emit_function(s) for s in members],
            method_defs=[bindings.method_def(s) for s in members],
        )
        files[name] = user_kernels.restore_lines(text, name)
    files.update(_thunk_files(ops, spec_name, shards))
    entries = [(info["name"], registry.to_json(info)) for info in registry.registry(ops)]
    digest = hashlib.sha256("".join(files[k] for k in sorted(files)).encode())
    digest.update("".join(j for _, j in entries).encode())
    files["module.cpp"] = _TEMPLATES.get_template("module.cpp.j2").render(
        spec_name=spec_name, module=module, shards=shards, registry=entries, build_id=digest.hexdigest()[:16]
    )
    files["kernel_ops.pyi"] = _TEMPLATES.get_template("kernel_ops.pyi.j2").render(
        spec_name=spec_name, functions=[stub.stub_function(s) for s in ops]
    )
    return files


def _thunk_files(ops: tuple[OpSpec, ...], spec_name: str, shards: int) -> dict[str, str]:
    """The C++ executor's thunks (`gen.thunks`), sharded as the bindings are, and the table of their tables."""
    files: dict[str, str] = {}
    for shard in range(shards):
        members = [s for s in ops if shard_of(s, shards) == shard]
        common, cuda = thunks.headers(members)
        pairs = [(s, k) for s in members for k in thunks.thunk_kernels(s)]
        name = f"thunks_{shard}.cpp"
        text = _TEMPLATES.get_template("thunks.cpp.j2").render(
            spec_name=spec_name,
            shard=shard,
            shards=shards,
            headers=common,
            cuda_headers=cuda,
            user_includes="\n".join(user_kernels.include_lines([s for s, _ in pairs])),
            thunks=[thunks.emit_thunk(s, k) for s, k in pairs],
            entries=[thunks.table_entry(s, k) for s, k in pairs],
        )
        files[name] = user_kernels.restore_lines(text, name)
    files["thunk_tables.cpp"] = _TEMPLATES.get_template("thunk_tables.cpp.j2").render(
        spec_name=spec_name, shards=shards, digest=thunk_digest(ops)
    )
    return files


def thunk_digest(ops: tuple[OpSpec, ...]) -> str:
    """The identity of the thunks of `ops`: a digest of every thunk and table entry in spec order, whatever the
    shards or the spec's file name. A package (csrc/opgen/package/package.h) records it and runs only where it
    matches."""
    digest = hashlib.sha256()
    for spec in ops:
        for kernel in thunks.thunk_kernels(spec):
            digest.update(thunks.emit_thunk(spec, kernel).encode())
            digest.update(thunks.table_entry(spec, kernel).encode())
    return digest.hexdigest()[:16]
