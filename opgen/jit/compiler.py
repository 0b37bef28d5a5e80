"""Compiling one specialization of a Triton function to a `KernelBinary`, through the disk cache,
on a background thread, so loading a kernel starts the work and only a first call that comes too
early waits for it."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from opgen.jit import cache, env, worker, workers
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
    # One thread for kernels compiled here: triton.compile is not known to be thread-safe.
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="opgen-jit")


@functools.cache
def _worker_threads() -> concurrent.futures.ThreadPoolExecutor:
    # One thread per compile worker, each waiting on its process (`opgen.jit.workers`).
    return concurrent.futures.ThreadPoolExecutor(max_workers=workers.count(), thread_name_prefix="opgen-jit-worker")


def submit(fn: Any, spec: Specialization, options: Options, device: int) -> concurrent.futures.Future[KernelBinary]:
    """Start loading or compiling in the background: a kernel opgen generated in a compile worker,
    several at once (`opgen.jit.workers`), any other on this process's compile thread.

    One binary is one job in a process: a model's layers bind one launcher each for the same fused
    kernel, and all of them submit it when they are bound, before the first compile has reached the
    disk cache (a 12-layer Qwen2 on the H100 compiled 62-70 binaries, of 23 distinct ones)."""
    key = (str(cache.jit_dir()), binary_key(fn, spec, options, device))  # another cache folder: another store
    with _SUBMITTED_LOCK:
        future = _SUBMITTED.get(key)
        if future is None or (future.done() and future.exception() is not None):  # a failure is tried again
            threads = _worker_threads() if _worker_file(fn) is not None else _pool()
            future = _SUBMITTED[key] = threads.submit(load_or_compile, fn, spec, options, device)
        return future


_SUBMITTED: dict[tuple[str, str], concurrent.futures.Future[KernelBinary]] = {}  # (cache folder, binary key) -> job
_SUBMITTED_LOCK = threading.Lock()


def _compile(fn: Any, spec: Specialization, options: Options, device: int, key: str) -> KernelBinary:
    start = time.perf_counter()
    args = (spec.signature, spec.constexprs, spec.attrs, options.num_warps, options.num_stages, env.target(device))
    try:
        fields = _fields(fn, args)
    except Exception as exc:
        raise JitError(f"Triton could not compile {fn.__name__} ({_describe(spec)}): {exc}") from exc
    cache.STATS.add("compiles")
    cache.STATS.add("compile_seconds", time.perf_counter() - start)
    if fields["num_ctas"] != 1:
        raise JitError(f"{fn.__name__}: kernels with num_ctas > 1 (thread-block clusters) are not supported")
    for scratch, size in fields["scratch"].items():
        if size > 0:
            raise JitError(f"{fn.__name__} needs Triton {scratch.split('_')[0]} scratch memory, not supported yet")
    return KernelBinary(
        key=key,
        name=fields["name"],
        cubin=fields["cubin"],
        num_warps=fields["num_warps"],
        num_stages=fields["num_stages"],
        shared=fields["shared"],
        extra_pointers=fields["extra_pointers"],  # Triton's ABI: one pointer per scratch kind it knows
        params=spec.params,
        meta=tuple((k, _jsonable(v)) for k, v in _meta_items(fn, spec)),
        arch=fields["arch"],
    )


def _fields(fn: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """Triton's compile of a generated kernel in a worker, else here (no worker, or it died)."""
    path = _worker_file(fn)
    if path is not None:
        try:
            status, value = workers.pool().compile((path, fn.__name__, *args))
        except workers.WorkerDied:
            pass
        else:
            if status != "ok":
                raise RuntimeError(value)
            return value  # type: ignore[no-any-return]
    return worker.compile_fields(fn, *args)


def _worker_file(fn: Any) -> str | None:
    """The module file a compile worker imports `fn` from, or None where `fn` compiles here."""
    return workers.generated_file(fn) if workers.count() > 0 else None


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
