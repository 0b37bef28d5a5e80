"""Call fuzzing: every kernel_ops function with hypothesis-drawn arguments, compared with eager torch.

Run in a child process (`test_call_fuzz.py`, `run_fuzz.py`) so that a crash or a hang fails the
run instead of killing it; each call prints `CALL <recipe>` first, so the last line before a
crash names it. Usage:

    python tests/hardening/call_fuzz.py --per-function 20 [--seed 0] [--functions add,mm] [--shard 0/4]

What counts as a failure (each prints a `FAIL` line; the exit status is 1 if there was any):
- `unclean`: kernel_ops raised something other than TypeError, ValueError, RuntimeError,
  IndexError, NotImplementedError, OverflowError or MemoryError, or a message that does not start
  with `kernel_ops.<name>(): `.
- `wrong`: both kernel_ops and eager (`torch.ops.aten.<op>.<overload>`) returned, and the results
  differ in type, structure, shape, dtype or values (`torch.testing.assert_close`, NaN equal to
  NaN; values are not compared for ops whose output is uninitialized memory, `empty*`), or the
  inputs differ afterwards (what an in-place or out call wrote), or an in-place/out call did not
  return its argument itself.
- `accepted`: kernel_ops returned where eager raised, unless eager's error is one kernel_ops skips
  by design (autograd: in-place on a leaf that requires grad; see ALLOWED_EAGER_ONLY).
Calls that kernel_ops refuses with a TypeError or OverflowError (an argument's type or range) are
not run eagerly (`refused_argument`): eager torch takes some such values and then misbehaves (an int
-295 as a dtype made it segfault). Nor are calls that a function's spec `checks:` refuse (a
ValueError or IndexError; `refused_by_check`): those kernels trust their caller, and eager crashes;
nor calls where an out variant refused an out sharing memory with an input (`refused_alias`).
Other calls that kernel_ops refuses cleanly while eager accepts them (lazy neg/conj bits, ...) are
counted as `stricter`, not failures. Calls on a tensor that another
thread keeps resizing (`racy`) are checked for crashes and clean errors only, and made only to
functions that hold the GIL during the kernel (see `check`).
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from call_recipes import Recipe, aten_op, materialize, recipes, sample_key, samples
from hypothesis import HealthCheck, Phase, given, seed, settings

from opgen import kernel_ops

ALLOWED = (TypeError, ValueError, RuntimeError, IndexError, NotImplementedError, OverflowError, MemoryError)
# Eager errors that come from the autograd layer kernel_ops skips on purpose (README: no autograd).
ALLOWED_EAGER_ONLY = ("a leaf Variable that requires grad", "requires grad", "inference tensor")
# Ops whose results (and, in place, whose inputs) hold uninitialized memory: values are not compared.
# A resize that grows a tensor leaves the new elements uninitialized.
UNINITIALIZED = ("empty", "empty_like", "empty_strided", "new_empty", "resize", "resize_as")
INFO = kernel_ops.get_kernel_ops_args_info()
FIXED_LIST = re.compile(r"(?:Sym)?[Ii]nt\[(\d+)\]\??")


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []

    def fail(self, kind: str, recipe: Recipe, message: str) -> None:
        self.counts[kind] += 1
        line = f"FAIL {kind} {recipe}: {message}"
        self.failures.append(line)
        print(line[:2000], flush=True)


def call(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return False, exc


def check(recipe: Recipe, tally: Tally, racy: torch.Tensor) -> None:
    name = recipe.name
    print(f"CALL {recipe}", flush=True)
    # A function that releases the GIL around its kernel (release_gil) runs while the resizer thread
    # frees the storage it reads: a data race eager torch has too (its bindings release the GIL; both
    # abort with heap corruption), so only functions that hold the GIL get the racy tensor.
    shared = None if INFO[name]["release_gil"] else racy
    try:
        mine = materialize(recipe, shared)
        ref = materialize(recipe, shared)
    except Exception:  # a mutation that cannot apply to this sample: not a call
        tally.counts["skipped"] += 1
        return
    tally.counts["calls"] += 1
    aliased = aliased_shapes(mine)
    ok, got = call(getattr(kernel_ops, name), *mine)
    if not ok:
        clean = isinstance(got, ALLOWED) and str(got).startswith(f"kernel_ops.{name}(): ")
        if not clean:
            tally.fail("unclean", recipe, f"{type(got).__name__}: {got}")
    if recipe.racy:
        tally.counts["racy"] += 1
        return
    if not ok and INFO[name]["checks"] and isinstance(got, (ValueError, IndexError)):
        # Refused by a check the spec asks for (`checks:`): the kernel trusts its caller, and eager
        # calls it unchecked, so eager may crash on this call (`_fft_r2c` with a repeated dim does).
        tally.counts["refused_by_check"] += 1
        return
    if not ok and isinstance(got, ValueError) and "shares memory with argument" in str(got):
        # An out variant refused an out sharing memory with an input (every out variant does): eager
        # takes it, and a kernel that resizes out then reads freed memory (reflection_pad2d.out).
        tally.counts["refused_alias"] += 1
        return
    if not ok and isinstance(got, (TypeError, OverflowError)):
        # The binding refused an argument's type or range. Eager is not asked: its dispatcher takes
        # some such values and then misbehaves (an int where a dtype goes indexes torch's dtype
        # table: dtype=-295 gives a UnicodeDecodeError, or a segfault).
        tally.counts["refused_argument"] += 1
        return
    print("EAGER", flush=True)  # a crash after this line is eager torch's
    eager_ok, expected = call(aten_op(name), *documented_repeats(name, *ref))
    if ok and eager_ok:
        tally.counts["both_ok"] += 1
        problem = compare(name, got, expected, mine, ref, values=not resized(aliased))
        if problem:
            tally.fail("wrong", recipe, problem)
    elif ok:
        if any(s in str(expected) for s in ALLOWED_EAGER_ONLY):
            tally.counts["eager_autograd_only"] += 1
        else:
            tally.fail("accepted", recipe, f"eager raised {type(expected).__name__}: {str(expected)[:300]}")
    elif eager_ok:
        tally.counts["stricter"] += 1
    else:
        tally.counts["both_raised"] += 1


def documented_repeats(name: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The call as eager must see it: kernel_ops takes one int for an `int[N]` or `SymInt[N]` argument
    and repeats it N times (docs/spec.md), where `torch.ops.aten` accepts that only for `int[N]`."""
    args, kwargs = list(args), dict(kwargs)
    for i, arg in enumerate(INFO[name]["args"]):
        size = FIXED_LIST.fullmatch(arg["type"])
        if size is None:
            continue
        where, key = (kwargs, arg["name"]) if arg["name"] in kwargs else (args, i)
        if key == i and i >= len(args):
            continue
        if isinstance(where[key], int) and not isinstance(where[key], bool):
            where[key] = [where[key]] * int(size.group(1))
    return args, kwargs


def compare(name: str, got: Any, expected: Any, mine: tuple, ref: tuple, values: bool) -> str | None:
    try:
        same(got, expected, values and sample_values(name), "result")
        for j, (a, e) in enumerate(zip(tensors(mine), tensors(ref), strict=True)):
            same(a, e, values and initialized(name), f"input tensor {j} after the call")
        info = INFO[name]
        if info["variant"] in ("inplace", "out"):
            targets = [mine[1].get(n) if n in mine[1] else _positional(mine[0], name, n) for n in info["mutates"]]
            returned = got if isinstance(got, tuple) else (got,)
            if len(targets) == len(returned) and any(r is not t for r, t in zip(returned, targets)):
                return "an in-place/out call did not return its argument itself"
    except AssertionError as exc:
        return str(exc)[:1000]
    return None


def _positional(args: list[Any], name: str, arg: str) -> Any:
    index = [a["name"] for a in INFO[name]["args"]].index(arg)
    return args[index] if index < len(args) else None


def sample_values(name: str) -> bool:
    return samples.SAMPLES[sample_key(name)].values and initialized(name)


def initialized(name: str) -> bool:
    return name.removesuffix("_out").removesuffix("_") not in UNINITIALIZED


def same(actual: Any, expected: Any, values: bool, what: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}, eager a Tensor"
        got, want = (tuple(actual.shape), actual.dtype), (tuple(expected.shape), expected.dtype)
        assert got == want, f"{what}: (shape, dtype) {got}, eager {want}"
        if values and expected.device.type != "meta":
            torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{what}: {m}")
        return
    assert type(actual) is type(expected), f"{what}: got {type(actual).__name__}, eager {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} items, eager {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            same(a, e, values, f"{what}[{i}]")
    else:
        assert actual == expected or actual != actual, f"{what}: {actual!r} != {expected!r}"


def aliased_shapes(call_args: tuple) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
    """Each tensor argument that shares its storage with another, with its shape before the call."""
    found = tensors(call_args)
    storages = Counter(t.untyped_storage().data_ptr() for t in found if t.numel())
    return [(t, tuple(t.shape)) for t in found if t.numel() and storages[t.untyped_storage().data_ptr()] > 1]


def resized(aliased: list[tuple[torch.Tensor, tuple[int, ...]]]) -> bool:
    """Whether the call resized a tensor that aliased another argument: an out argument that is also
    an input and has the wrong shape is reallocated before the kernel reads the input, so what the
    kernel computes from it is uninitialized memory, in eager torch as in kernel_ops."""
    return any(tuple(t.shape) != shape for t, shape in aliased)


def tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in tensors(item)]
    return []


def resizer(t: torch.Tensor, stop: threading.Event) -> None:
    """Keeps resizing `t` (storage reallocated) while calls read it."""
    sizes = ((3, 4), (0,), (64, 64), (), (2, 2, 2))
    k = 0
    while not stop.is_set():
        t.resize_(sizes[k % len(sizes)])
        k += 1
        time.sleep(0)  # lets the calling thread take the GIL between resizes


def fuzz_function(name: str, examples: int, seed_value: int, tally: Tally, racy: torch.Tensor) -> None:
    spec = samples.SAMPLES.get(sample_key(name))
    if spec is None:
        return

    @seed(seed_value)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(recipes(name, spec, INFO[name]))
    def run(recipe: Recipe) -> None:
        check(recipe, tally, racy)

    run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-function", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--functions", default="")
    parser.add_argument("--shard", default="0/1")
    options = parser.parse_args()
    names = options.functions.split(",") if options.functions else kernel_ops.get_kernel_op_names()
    index, count = map(int, options.shard.split("/"))
    names = names[index::count]
    torch.set_num_threads(1)
    racy, stop = torch.ones(3, 4), threading.Event()
    thread = threading.Thread(target=resizer, args=(racy, stop), daemon=True)
    thread.start()
    tally, start = Tally(), time.perf_counter()
    try:
        for name in names:
            fuzz_function(name, options.per_function, options.seed, tally, racy)
    finally:
        stop.set()
        thread.join()
    counts = " ".join(f"{k}={v}" for k, v in sorted(tally.counts.items()))
    print(f"DONE functions={len(names)} {counts} seconds={time.perf_counter() - start:.1f}", flush=True)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
