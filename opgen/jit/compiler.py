"""Compiling one specialization of a Triton function to a `KernelBinary`, through the disk cache,
on a background thread, so loading a kernel starts the work and only a first call that comes too
early waits for it."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import time
from dataclasses import dataclass
from typing import Any

from opgen.jit import cache, env
from opgen.jit.binary import KernelBinary
from opgen.jit.errors import JitError
from opgen.jit.specialize import Specialization


@dataclass(frozen=True, slots=True)
class Options:
    num_warps: int = 4
    num_stages: int = 3


def binary_key(fn: Any, spec: Specialization, options: Options, device: int) -> str:
    return cache.make_key(("opgen-jit 1", fn.cache_key, spec.key(), options, env.fingerprint(device)))


def load_or_compile(fn: Any, spec: Specialization, options: Options, device: int) -> KernelBinary:
    key = binary_key(fn, spec, options, device)
    binary = cache.load_binary(key)
    if binary is None:
        binary = _compile(fn, spec, options, device, key)
        cache.store_binary(binary)
    return binary


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    # One worker: triton.compile is not known to be thread-safe; ptxas runs outside the GIL anyway.
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="opgen-jit")


def submit(fn: Any, spec: Specialization, options: Options, device: int) -> concurrent.futures.Future[KernelBinary]:
    """Start loading or compiling in the background."""
    return _pool().submit(load_or_compile, fn, spec, options, device)


def _compile(fn: Any, spec: Specialization, options: Options, device: int, key: str) -> KernelBinary:
    import triton
    from triton.compiler import ASTSource

    start = time.perf_counter()
    src = ASTSource(fn, spec.signature, spec.constexprs, spec.attrs)
    try:
        compiled = triton.compile(
            src, target=env.target(device), options={"num_warps": options.num_warps, "num_stages": options.num_stages}
        )
    except Exception as exc:
        raise JitError(f"Triton could not compile {fn.__name__} ({_describe(spec)}): {exc}") from exc
    cache.STATS.add("compiles")
    cache.STATS.add("compile_seconds", time.perf_counter() - start)
    md = compiled.metadata
    if getattr(md, "num_ctas", 1) != 1:
        raise JitError(f"{fn.__name__}: kernels with num_ctas > 1 (thread-block clusters) are not supported")
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, scratch, 0) > 0:
            raise JitError(f"{fn.__name__} needs Triton {scratch.split('_')[0]} scratch memory, not supported yet")
    # Triton's ABI appends one pointer per scratch kind its version knows, null when unused.
    extra = sum(hasattr(md, s) for s in ("global_scratch_size", "profile_scratch_size"))
    return KernelBinary(
        key=key,
        name=md.name,
        cubin=compiled.asm["cubin"],
        num_warps=md.num_warps,
        num_stages=md.num_stages,
        shared=md.shared,
        extra_pointers=extra,
        params=spec.params,
        meta=tuple((k, _jsonable(v)) for k, v in _meta_items(fn, spec)),
        arch=str(md.arch),
    )


def _meta_items(fn: Any, spec: Specialization) -> list[tuple[str, Any]]:
    names = {p.num: p.name for p in fn.params}
    return [(names[k[0]], v) for k, v in spec.constexprs.items()]


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def _describe(spec: Specialization) -> str:
    return ", ".join(f"{k}: {v}" for k, v in spec.signature.items())
