"""Leak checks: many calls of representative kernel_ops functions and of a compiled graph, and many
compiles and frees of graphs, must leave resident memory flat and reference counts unchanged.

    python tests/hardening/leak_check.py calls --count 1000000
    python tests/hardening/leak_check.py graph --count 1000000
    python tests/hardening/leak_check.py compiles --count 1000

Prints `DONE rss_before_mb=... rss_after_mb=... growth_mb=... refcount_changes=... objects_growth=...`;
"before" is measured after a warm-up of a tenth of the count (allocator pools, caches, the first
specialization), "after" at the end. `FAIL` lines (exit status 1) name what changed: resident
memory beyond LIMITS, a changed reference count of an argument, the model or the input, a compiled
function still alive after it was dropped, or (calls and graph calls) more gc-tracked objects.
Compiles do leave objects behind that are torch's, not opgen's: torch.fx registers every
GraphModule's generated code in `linecache` (`<eval_with_key>.N`, a lazy entry of three objects) and
never removes it, about 18 per export here; `linecache_growth` shows them.
"""

from __future__ import annotations

import argparse
import gc
import linecache
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

import opgen
from opgen import kernel_ops as k

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def representative_calls() -> tuple[list[Callable[[], Any]], list[Any]]:
    """Calls across the binding's paths (fresh, in-place, out, tuple and list results, views,
    scalars, lists, GIL release, clean errors), and every object they pass."""
    a, b, m = torch.randn(4, 4), torch.randn(4), torch.randn(8, 8)
    out, x = torch.empty(4, 4), torch.randn(1, 2, 6, 6)
    w, idx = torch.randn(3, 2, 3, 3), torch.tensor([0, 2])
    alpha, dims, size, eps = 2.5, [0], [16], 1e-5
    calls = [
        lambda: k.add(a, b, alpha=alpha),
        lambda: k.mul_scalar_(out, 1.0),
        lambda: k.add_out(a, b, out=out),
        lambda: k.mm(m, m),
        lambda: k.sum_dim(a, dims, keepdim=True),
        lambda: k.max_dim(a, 1),
        lambda: k.split(a, 2),
        lambda: k.view(a, size),
        lambda: k.cat([a, a]),
        lambda: k.index_select(a, 0, idx),
        lambda: k.conv2d(x, w),
        lambda: k.layer_norm(a, [4], eps=eps),
        lambda: k.relu(a),
    ]
    errors = [lambda: k.add(a, "x"), lambda: k.mm(a, b), lambda: k.view(a, [5]), lambda: k.add(a, a, nope=1)]
    return calls + [_swallow(e) for e in errors], [a, b, m, out, x, w, idx, alpha, dims, size, eps]


def _swallow(call: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            call()
        except (TypeError, ValueError, RuntimeError, IndexError):
            pass

    return run


class Model(torch.nn.Module):
    """Linear layers, a matrix product, a residual add and a reduction: memory planning reuses buffers
    here (the product's)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.mix = torch.nn.Parameter(torch.randn(width, width) / width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x)) @ self.mix
        return (self.fc2(h) + x).softmax(-1)


def refcounts(objects: list[Any]) -> list[int]:
    return [sys.getrefcount(o) for o in objects]


def measure(run: Callable[[int], None], count: int, watched: list[Any]) -> dict[str, float]:
    warm = max(count // 10, 1)
    run(warm)
    gc.collect()
    refs = refcounts(watched)
    objects, lines, before = len(gc.get_objects()), len(linecache.cache), rss_mb()
    start = time.perf_counter()
    run(count - warm)
    seconds = time.perf_counter() - start
    gc.collect()
    after = rss_mb()
    changed = sum(a != b for a, b in zip(refs, refcounts(watched)))
    return {
        "count": count,
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1),
        "growth_mb": round(after - before, 2),
        "refcount_changes": changed,
        "objects_growth": len(gc.get_objects()) - objects,
        "linecache_growth": len(linecache.cache) - lines,
        "seconds": round(seconds, 1),
    }


def check_calls(count: int) -> dict[str, float]:
    calls, watched = representative_calls()

    def run(n: int) -> None:
        rounds = n // len(calls) + 1
        for _ in range(rounds):
            for call in calls:
                call()

    return measure(run, count, watched)


def check_graph(count: int) -> dict[str, float]:
    x = torch.randn(4, 16)
    with torch.no_grad():
        fast = opgen.compile(Model().eval(), (x,), cache=False)

    def run(n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                fast(x)

    return measure(run, count, [x, fast])


def check_compiles(count: int) -> dict[str, float]:
    """Compiles and frees: each graph's function, artifact and constants must be freed."""
    x = torch.randn(2, 16)
    model = Model().eval()
    alive: list[weakref.ref[Any]] = []

    def run(n: int) -> None:
        with torch.no_grad():
            for i in range(n):
                fast = opgen.compile(model, (x,), cache=i % 2 == 0)
                fast(x)
                alive.append(weakref.ref(fast))
                del fast
        gc.collect()

    result = measure(run, count, [x, model])
    result["functions_alive"] = sum(r() is not None for r in alive)
    return result


LIMITS = {"calls": 4.0, "graph": 4.0, "compiles": 24.0}  # MB of growth after the warm-up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=sorted(LIMITS))
    parser.add_argument("--count", type=int, default=100_000)
    options = parser.parse_args()
    torch.set_num_threads(1)
    check = {"calls": check_calls, "graph": check_graph, "compiles": check_compiles}[options.what]
    result = check(options.count)
    failures = []
    # Under AddressSanitizer (make asan) freed memory sits in its quarantine: RSS says nothing there.
    sanitized = "libasan" in os.environ.get("LD_PRELOAD", "")
    if result["growth_mb"] > LIMITS[options.what] and not sanitized:
        failures.append(f"resident memory grew by {result['growth_mb']} MB (limit {LIMITS[options.what]})")
    if result["refcount_changes"]:
        failures.append(f"{result['refcount_changes']} watched objects changed reference count")
    if options.what != "compiles" and result["objects_growth"] > 0:
        failures.append(f"{result['objects_growth']} more gc-tracked objects")
    if result.get("functions_alive"):
        failures.append(f"{result['functions_alive']} compiled functions still alive after being dropped")
    for failure in failures:
        print(f"FAIL {options.what}: {failure}", flush=True)
    print("DONE " + " ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
