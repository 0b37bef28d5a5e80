"""The multi-kernel choice: several kernels that compute the same thing; the fastest one runs.

The first call with real arguments of each size times every candidate (on copies of the arguments
they write, `opgen.jit.timing`), keeps the fastest, and stores the pick in the JIT cache under what
the candidates compute (`identity`), so later processes, and the same kernel in a model's other
layers, benchmark nothing. With `reliable` (a candidate that always works, such as the ATen kernels
a generated one replaces), a candidate that raises on its first call (a kernel that fails to
compile) is dropped with a warning and the reliable one runs. `force`, or `OPGEN_FORCE_KERNEL`
(`opgen.jit.forcing`: a candidate for every choice, or one for a named kernel), skips the benchmark.
Calls go through an `opgen._C.Switch`; where sizes never change (compiled graphs guard them) the
switch is pointed at the pick itself, so later calls pay one C-level indirection and no Python.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opgen.errors import warn
from opgen.jit import cache, env, forcing
from opgen.jit.autotune import bound, size_key
from opgen.jit.timing import time_calls

Candidate = Callable[..., Any]


class Choice:
    def __init__(
        self,
        name: str,
        candidates: Mapping[str, Candidate],
        *,
        identity: Sequence[str] = (),
        writes: Sequence[int] = (),
        force: str | None = None,
        fixed_sizes: bool = False,
        reliable: str | None = None,
        names: Sequence[str] = (),
    ) -> None:
        """`names`: what `OPGEN_FORCE_KERNEL=<kernel>=<candidate>` may call this choice, besides `name`
        (`opgen.jit.forcing`)."""
        if len(candidates) < 1:
            raise ValueError(f"Choice {name!r} needs at least one candidate")
        if force is not None and force not in candidates:
            raise ValueError(f"Choice {name!r}: force={force!r} is not a candidate ({', '.join(candidates)})")
        if force is None:
            force = forcing.forced_candidate((name, *names), candidates)
        self.name = name
        self.candidates = dict(candidates)
        # What the candidates compute (the pick's cache key, with their names and the sizes): choices of
        # one identity share a pick, across processes and across a model's repeated layers.
        self.identity = tuple(identity)
        self.writes = tuple(writes)
        self.force = force
        self.fixed_sizes = fixed_sizes
        self.reliable = reliable
        self.failed: dict[str, str] = {}  # candidate -> why it was dropped
        self.picks: dict[tuple[Any, ...], tuple[str, str]] = {}  # size key -> (candidate, why)
        self._by_size: dict[tuple[Any, ...], Candidate] = {}
        self._lock = threading.Lock()
        native = env.native()
        self.call: Any = native.Switch(self._dispatch) if native is not None else self._dispatch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def describe(self) -> str:
        if not self.picks:
            return f"{self.name}: not called yet (candidates: {', '.join(self.candidates)})"
        return "; ".join(f"{self.name}: {pick} ({why})" for pick, why in self.picks.values())

    def _dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """Keyword arguments (a kernel's keyword-only ones: `alpha=2.5`) reach every candidate as keywords."""
        key = size_key(args) + tuple((k, *size_key((v,))) for k, v in kwargs.items()) if kwargs else size_key(args)
        chosen = self._by_size.get(key)
        if chosen is not None:
            return chosen(*args, **kwargs)
        with self._lock:
            chosen = self._by_size.get(key)
            if chosen is not None:
                return chosen(*args, **kwargs)
            chosen = self._choose(key, args, kwargs)
            if self.reliable is None or chosen is self.candidates[self.reliable]:
                return chosen(*args, **kwargs)
            try:  # the pick's first real call, where a cached pick meets a kernel that fails here
                return chosen(*args, **kwargs)
            except Exception as exc:
                name = self.picks[key][0]
                self._drop(name, exc)
                self.picks[key] = (self.reliable, f"{name} failed: {exc}")
                return self._repoint(key, self.reliable)(*args, **kwargs)

    def _drop(self, name: str, exc: BaseException) -> None:
        self.failed[name] = str(exc)
        warn(f"opgen: {self.name}: candidate {name!r} failed ({exc}); running {self.reliable!r} instead")

    def _repoint(self, key: tuple[Any, ...], name: str) -> Candidate:
        chosen = self._by_size[key] = self.candidates[name]
        if self.fixed_sizes and env.native() is not None:
            self.call.target = chosen
        return chosen

    def _choose(self, key: tuple[Any, ...], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Candidate:
        if self.force is not None:
            name, why = self.force, "forced"
        else:
            name, why = self._benchmarked(key, args, kwargs)
        self.picks[key] = (name, why)
        return self._repoint(key, name)

    def _benchmarked(self, key: tuple[Any, ...], args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
        pick_key = cache.make_key(("choice", self.identity or self.name, tuple(self.candidates), key))
        record = cache.load_pick(pick_key)
        if record is not None and record.get("pick") in self.candidates:
            cache.STATS.add("choice_hits")
            return record["pick"], "pick from the cache"
        calls = {}
        for name, fn in self.candidates.items():
            if name in self.failed:
                continue
            call = bound(functools.partial(fn, **kwargs) if kwargs else fn, args, self.writes)
            try:
                call()  # its first run: a candidate that cannot run (a kernel that fails to compile) raises here
            except Exception as exc:
                if self.reliable is None or name == self.reliable:
                    raise
                self._drop(name, exc)
                continue
            calls[name] = call
        # Timed together (`opgen.jit.timing`): the pick is shared by every choice of one identity (a model's
        # repeated layers), so a slow moment must not decide it. On an H100, one timing of each
        # candidate after the other once sent all 24 of BERT's residual + layer-norm kernels to ATen
        # (710 us of GPU work a call against 541 when they run as Triton).
        if len(calls) == 1:  # the others failed: nothing to time
            return next(iter(calls)), "the only candidate that runs"
        start = time.perf_counter()
        measured = time_calls(list(calls.values()))
        timings = dict(zip(calls, measured.us, strict=True))
        cache.STATS.add("tune_seconds", time.perf_counter() - start)
        best = min(timings, key=timings.__getitem__)
        cache.STATS.add("choices")
        if not self.failed and measured.trusted:  # a failure may be this machine's: the next process tries again
            cache.store_pick(pick_key, {"pick": best, "timings_us": timings})
        shown = ", ".join(f"{n} {t:.1f} us" for n, t in timings.items())
        return best, f"fastest on the first call: {shown}{measured.caveat}"
