"""Autotuning: the first call with real arguments times every config and keeps the fastest.

Configs are timed together (`opgen.jit.timing`), on copies of the arguments the
kernel writes (those it declares, or every tensor when it declares none), so the caller's tensors
are written once, by the real launch after the pick.
The pick is stored in the JIT cache, keyed by the configs' binaries and the argument sizes, so a
second process tunes nothing (unless the host was too slow for a clean timing: then the next process
times again).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import torch

from opgen.jit import cache, compiler, env
from opgen.jit.binary import KernelBinary
from opgen.jit.errors import JitError
from opgen.jit.specialize import Specialization
from opgen.jit.timing import time_calls


class Tunable(Protocol):
    """What autotuning needs of a kernel (`opgen.jit.kernels.JitKernel`, which calls `pick`)."""

    fn: Any
    name: str
    configs: tuple[Any, ...]
    mutates: tuple[int, ...] | None
    native: Any  # the extension module whose JitLauncher type the kernel's launchers are

    def add_variant(self, binary: KernelBinary, config: Any, args: Sequence[Any], *, into: Any = None) -> None: ...


def size_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a pick depends on besides the binaries: tensor sizes, strides, dtypes and 16-byte alignment (a
    Triton binary specializes on it: a pick timed on a misaligned view is not one for aligned tensors), other
    values."""
    return tuple(
        (tuple(a.shape), tuple(a.stride()), str(a.dtype), a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
        else repr(a) for a in args
    )  # fmt: skip


def pick(
    kernel: Tunable,
    args: Sequence[Any],
    specs: Sequence[Specialization],
    futures: Sequence[concurrent.futures.Future[KernelBinary]],
    device: int,
) -> tuple[int, str]:
    keys = [compiler.binary_key(kernel.fn, s, c.options, device) for s, c in zip(specs, kernel.configs, strict=True)]
    key = cache.make_key(("tune", keys, size_key(args)))
    record = cache.load_pick(key)
    cached = record.get("index", -1) if record is not None else -1
    if 0 <= cached < len(keys) and env.fits(futures[cached].result().shared, device):  # waits for its binary alone
        cache.STATS.add("tune_hits")
        return cached, "autotune pick from the cache"
    fitting, skipped = _fitting(kernel, [future.result() for future in futures], device)
    if len(fitting) == 1:
        return fitting[0], f"the only config that fits{skipped}"
    start = time.perf_counter()
    calls = [_config_call(kernel, futures[i].result(), kernel.configs[i], args) for i in fitting]
    timings = time_calls(calls)
    index = fitting[min(range(len(timings.us)), key=timings.us.__getitem__)]
    cache.STATS.add("tunes")
    cache.STATS.add("tune_seconds", time.perf_counter() - start)
    if timings.trusted:
        cache.store_pick(key, {"index": index, "timings_us": timings.us})
    shown = ", ".join(f"{t:.1f}" for t in timings.us)
    return index, f"autotuned on the first call (us per launch: {shown}){timings.caveat}{skipped}"


def _fitting(kernel: Tunable, binaries: Sequence[KernelBinary], device: int) -> tuple[list[int], str]:
    """The configs whose binaries the device can launch (`env.fits`: the others need more shared memory than
    it allows a program), and a note of those skipped ("" for none); JitError where none fits."""
    fitting = [i for i, b in enumerate(binaries) if env.fits(b.shared, device)]
    if not fitting:
        needs = ", ".join(str(b.shared) for b in binaries)
        raise JitError(
            f"{kernel.name}: every config needs more shared memory ({needs} bytes) than device {device} allows a "
            f"program ({env.shared_memory_limit(device)}); fewer num_stages or smaller blocks fit"
        )
    skipped = len(binaries) - len(fitting)
    return fitting, f"; {skipped} config(s) skipped: too much shared memory" if skipped else ""


def _config_call(kernel: Tunable, binary: KernelBinary, config: Any, args: Sequence[Any]) -> Callable[[], Any]:
    """A launch of one config on copies of what the kernel writes, through a launcher of its own."""
    native = kernel.native
    scratch = native.JitLauncher(kernel.name, len(args), None)
    kernel.add_variant(binary, config, args, into=scratch)
    written = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if kernel.mutates is not None:
        written = [i for i in written if i in kernel.mutates]
    return bound(lambda *copies: native.jit_launch_strict(scratch, *copies), args, written)


def bound(fn: Callable[..., Any], args: Sequence[Any], written: Collection[int]) -> Callable[[], Any]:
    """`fn(*args)` as a call of no arguments, on copies of the arguments at `written` (made once)."""
    copies = [clone_like(a) if i in written else a for i, a in enumerate(args)]
    return lambda: fn(*copies)


def clone_like(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and alignment (so it fits the same specialization)."""
    misalign = t.data_ptr() % 16
    offset = misalign // t.element_size() if misalign % t.element_size() == 0 else 0
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    base = torch.empty(span + offset, dtype=t.dtype, device=t.device)
    copy = base.as_strided(t.shape, t.stride(), offset)
    copy.copy_(t)
    return copy
