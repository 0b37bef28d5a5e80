"""`python -m opgen.bench ops`: each op through kernel_ops vs the eager torch call doing the same.

Interleaved in one process (../shared/BENCH.md), one thread, tensors of shape (s, s) for the sizes
1 element, 16 elements and 256x256. Prints per op and size the medians and the ratio
kernel_ops / torch, then the median ratio over tiny tensors. With `--device cuda` the tensors live
on the GPU and the time is the enqueue time (host time of one call, the GPU idle at its start).

One case binds a kernel of the user's own: `scaled_add (user)` builds the example project
opgen/examples/user_kernels once into opgen's cache folder (a minute or two, progress on stderr) and
times its direct binding, `my_ops.kernel_ops.scaled_add`, against the same kernel through the
dispatcher, `torch.ops.mylib.scaled_add` (in the torch column). It has its own ratio line, outside
the tiny-tensor median; without cmake and ninja it is left out, saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from opgen import kernel_ops as k
from opgen.bench.timing import format_table, interleaved

SIZES = {"1": 1, "16": 4, "64k": 256}  # label -> side of the (s, s) tensors
TINY = ("1", "16")
TARGET_ADD, TARGET_MEDIAN = 0.70, 0.75
USER_CASE, TARGET_USER = "scaled_add (user)", 0.50  # the user's kernel: direct binding / dispatcher

Call = Callable[[], object]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    make: Callable[[int], tuple[Call, Call]]  # side -> (kernel_ops call, eager call)


def _t(s: int, *shape: int) -> torch.Tensor:
    return torch.randn(*(shape or (s, s)))


def _binary(kop: Callable, eager: Callable) -> Callable[[int], tuple[Call, Call]]:
    def make(s: int) -> tuple[Call, Call]:
        a, b = _t(s), _t(s)
        return (lambda: kop(a, b)), (lambda: eager(a, b))

    return make


def _unary(kop: Callable, eager: Callable, positive: bool = False) -> Callable[[int], tuple[Call, Call]]:
    def make(s: int) -> tuple[Call, Call]:
        a = _t(s).abs() + 0.1 if positive else _t(s)
        return (lambda: kop(a)), (lambda: eager(a))

    return make


def _inplace_add(s: int) -> tuple[Call, Call]:
    a, b = _t(s), _t(s) * 0
    return (lambda: k.add_(a, b)), (lambda: a.add_(b))


def _out_add(s: int) -> tuple[Call, Call]:
    a, b, o = _t(s), _t(s), _t(s)
    return (lambda: k.add_out(a, b, out=o)), (lambda: torch.add(a, b, out=o))


def _where(s: int) -> tuple[Call, Call]:
    c, a, b = _t(s) > 0, _t(s), _t(s)
    return (lambda: k.where(c, a, b)), (lambda: torch.where(c, a, b))


def _with(s: int, kop: Callable[[torch.Tensor], object], eager: Callable[[torch.Tensor], object]):
    a = _t(s)
    return (lambda: kop(a)), (lambda: eager(a))


def _matmul(kind: str) -> Callable[[int], tuple[Call, Call]]:
    def make(s: int) -> tuple[Call, Call]:
        a, b, bias = _t(s), _t(s), _t(s)
        if kind == "mm":
            return (lambda: k.mm(a, b)), (lambda: torch.mm(a, b))
        if kind == "addmm":
            return (lambda: k.addmm(bias, a, b)), (lambda: torch.addmm(bias, a, b))
        a3, b3 = a.unsqueeze(0), b.unsqueeze(0)
        return (lambda: k.bmm(a3, b3)), (lambda: torch.bmm(a3, b3))

    return make


def _layer_norm(s: int) -> tuple[Call, Call]:
    x, w, b = _t(s), _t(1, s), _t(1, s)
    w, b = w.reshape(s), b.reshape(s)
    return (lambda: k.layer_norm(x, [s], w, b)), (lambda: F.layer_norm(x, [s], w, b))


def _embedding(s: int) -> tuple[Call, Call]:
    weight, idx = _t(s), torch.randint(0, s, (s,))
    return (lambda: k.embedding(weight, idx)), (lambda: F.embedding(idx, weight))


def _conv2d(s: int) -> tuple[Call, Call]:
    x, w = _t(s, 1, 3, s, s), _t(s, 8, 3, 3, 3)
    return (lambda: k.conv2d(x, w, None, 1, 1)), (lambda: F.conv2d(x, w, None, 1, 1))


def _max_pool(s: int) -> tuple[Call, Call]:
    x = _t(s, 1, 4, s * 2, s * 2)
    return (lambda: k.max_pool2d_with_indices(x, [2, 2], [2, 2])), (lambda: F.max_pool2d(x, 2, 2, return_indices=True))


def _cat(s: int) -> tuple[Call, Call]:
    a, b = _t(s), _t(s)
    return (lambda: k.cat([a, b])), (lambda: torch.cat([a, b]))


def _factory(kind: str) -> Callable[[int], tuple[Call, Call]]:
    def make(s: int) -> tuple[Call, Call]:
        size, device = [s, s], torch.get_default_device()
        if kind == "zeros":
            return (lambda: k.zeros(size, device=device)), (lambda: torch.zeros(size, device=device))
        return (lambda: k.arange(0, s * s, device=device)), (lambda: torch.arange(0, s * s, device=device))

    return make


CASES = [
    Case("add", _binary(k.add, torch.add)),
    Case("add_ (inplace)", _inplace_add),
    Case("add_out (out=)", _out_add),
    Case("sub", _binary(k.sub, torch.sub)),
    Case("mul", _binary(k.mul, torch.mul)),
    Case("div", _binary(k.div, torch.div)),
    Case("maximum", _binary(k.maximum, torch.maximum)),
    Case("eq", _binary(k.eq, torch.eq)),
    Case("where", _where),
    Case("mul_scalar", lambda s: _with(s, lambda a: k.mul_scalar(a, 2.0), lambda a: torch.mul(a, 2.0))),
    Case("clamp", lambda s: _with(s, lambda a: k.clamp(a, -1, 1), lambda a: torch.clamp(a, -1, 1))),
    Case("neg", _unary(k.neg, torch.neg)),
    Case("exp", _unary(k.exp, torch.exp)),
    Case("sqrt", _unary(k.sqrt, torch.sqrt, positive=True)),
    Case("tanh", _unary(k.tanh, torch.tanh)),
    Case("sigmoid", _unary(k.sigmoid, torch.sigmoid)),
    Case("relu", _unary(k.relu, torch.relu)),
    Case("gelu", _unary(k.gelu, F.gelu)),
    Case("silu", _unary(k.silu, F.silu)),
    Case("sum", _unary(k.sum, torch.sum)),
    Case("sum_dim", lambda s: _with(s, lambda a: k.sum_dim(a, [1]), lambda a: torch.sum(a, [1]))),
    Case("mean", lambda s: _with(s, lambda a: k.mean(a, [1]), lambda a: torch.mean(a, [1]))),
    Case("amax", lambda s: _with(s, lambda a: k.amax(a, [1]), lambda a: torch.amax(a, [1]))),
    Case("argmax", _unary(k.argmax, torch.argmax)),
    Case("softmax", lambda s: _with(s, lambda a: k._softmax(a, 1, False), lambda a: torch.softmax(a, 1))),
    Case("view", lambda s: _with(s, lambda a: k.view(a, [-1]), lambda a: a.view(-1))),
    Case("reshape", lambda s: _with(s, lambda a: k.reshape(a, [-1]), lambda a: a.reshape(-1))),
    Case("permute", lambda s: _with(s, lambda a: k.permute(a, [1, 0]), lambda a: a.permute(1, 0))),
    Case("transpose", lambda s: _with(s, lambda a: k.transpose(a, 0, 1), lambda a: a.transpose(0, 1))),
    Case("unsqueeze", lambda s: _with(s, lambda a: k.unsqueeze(a, 0), lambda a: a.unsqueeze(0))),
    Case("expand", lambda s: _with(s, lambda a: k.expand(a, [2, s, s]), lambda a: a.expand(2, s, s))),
    Case("select", lambda s: _with(s, lambda a: k.select(a, 0, 0), lambda a: a.select(0, 0))),
    Case("narrow", lambda s: _with(s, lambda a: k.narrow(a, 1, 0, 1), lambda a: a.narrow(1, 0, 1))),
    Case("clone", _unary(k.clone, torch.clone)),
    Case("cat", _cat),
    Case("mm", _matmul("mm")),
    Case("addmm", _matmul("addmm")),
    Case("bmm", _matmul("bmm")),
    Case("layer_norm", _layer_norm),
    Case("embedding", _embedding),
    Case("conv2d", _conv2d),
    Case("max_pool2d", _max_pool),
    Case("zeros", _factory("zeros")),
    Case("arange", _factory("arange")),
]


def _user_case() -> Case:
    """The user-kernel case, building the example project first where its build is not up to date.
    Raises ExampleBuildError (a RuntimeError) when it cannot be built, ImportError when it cannot be loaded."""
    from opgen.examples import build_user_kernels, default_build_dir

    folder = build_user_kernels(default_build_dir(), progress=lambda line: print(line, file=sys.stderr, flush=True))
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    import my_ops  # registers torch.ops.mylib.scaled_add

    def make(s: int) -> tuple[Call, Call]:
        a, b = _t(s), _t(s)

        def direct() -> object:
            return my_ops.kernel_ops.scaled_add(a, b, alpha=2.0)

        def dispatched() -> object:
            return torch.ops.mylib.scaled_add(a, b, alpha=2.0)

        return direct, dispatched

    return Case(USER_CASE, make)


def run(cases: list[Case], sizes: list[str], repeats: int, cuda: bool = False) -> list[dict[str, object]]:
    sync = torch.cuda.synchronize if cuda else None
    device = torch.device("cuda" if cuda else "cpu")
    rows = []
    for case in cases:
        for label in sizes:
            torch.manual_seed(0)
            with device:  # inputs made there; no default device while timing: its mode slows every torch call
                ours, eager = case.make(SIZES[label])
            eager_t, ours_t = interleaved([eager, ours], repeats=repeats, sync=sync, enqueue=cuda)
            rows.append(
                {
                    "op": case.name,
                    "size": label,
                    "torch_us": eager_t.median_us,
                    "kernel_ops_us": ours_t.median_us,
                    "ratio": ours_t.ratio_to(eager_t),
                    "torch_min_max": (eager_t.min_us, eager_t.max_us),
                    "kernel_ops_min_max": (ours_t.min_us, ours_t.max_us),
                }
            )
            print(
                f"  {case.name:16s} {label:>4s}: {ours_t.median_us:8.2f} us vs {eager_t.median_us:8.2f} us "
                f"({rows[-1]['ratio']:.2f}x)",
                flush=True,
            )
    return rows


def summary(rows: list[dict[str, object]], targets: bool = True) -> list[str]:
    """The ratios over tiny tensors; `targets`: against the CPU issue's targets (they are CPU figures)."""
    tiny = [float(r["ratio"]) for r in rows if r["size"] in TINY and r["op"] != USER_CASE]  # type: ignore[arg-type]
    add = [float(r["ratio"]) for r in rows if r["op"] == "add" and r["size"] in TINY]  # type: ignore[arg-type]
    user = [float(r["ratio"]) for r in rows if r["op"] == USER_CASE and r["size"] in TINY]  # type: ignore[arg-type]
    lines = []
    if add:
        verdict = f" ({'meets' if max(add) <= TARGET_ADD else 'misses'} the {TARGET_ADD:.2f}x target)"
        lines.append(
            f"kernel_ops.add / torch.add on tiny tensors: {', '.join(f'{r:.2f}x' for r in add)}"
            + (verdict if targets else "")
        )
    if tiny:
        median = statistics.median(tiny)
        verdict = f" ({'meets' if median <= TARGET_MEDIAN else 'misses'} the {TARGET_MEDIAN:.2f}x target)"
        lines.append(f"median ratio over {len(tiny)} tiny-tensor cases: {median:.2f}x" + (verdict if targets else ""))
    if user:
        verdict = f" ({'meets' if max(user) <= TARGET_USER else 'misses'} the {TARGET_USER:.2f}x target)"
        lines.append(
            "your own kernel, my_ops.kernel_ops.scaled_add / torch.ops.mylib.scaled_add (the dispatcher) on tiny "
            f"tensors: {', '.join(f'{r:.2f}x' for r in user)}" + (verdict if targets else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench ops", description=__doc__)
    parser.add_argument("--ops", help="comma-separated case names (default: all; scaled_add: the user-kernel case)")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated of {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=7, help="repeats per candidate (median reported)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the tensors live")
    args = parser.parse_args(argv)
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    wanted = set(args.ops.split(",")) if args.ops else None
    names = [c.name.split()[0] for c in CASES] + [USER_CASE.split()[0]]
    if unknown or (wanted and not wanted & set(names)):
        parser.error(f"unknown size(s) {unknown} or op(s) {args.ops}; ops: {', '.join(names)}")
    cases = [c for c in CASES if wanted is None or c.name.split()[0] in wanted]
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    torch.set_num_threads(1)
    if wanted is None or USER_CASE.split()[0] in wanted:
        try:
            cases.append(_user_case())
        except (RuntimeError, ImportError) as e:
            why = str(e).partition("\n")[0]  # the build's output tail stays out
            print(f"{USER_CASE} left out: {why}", flush=True)
    if not cases:
        return 1
    where = f"{torch.cuda.get_device_name()}, enqueue time" if args.device == "cuda" else "CPU"
    print(
        f"opgen op benchmark: torch {torch.__version__}, {where}, 1 thread, {args.repeats} interleaved repeats, "
        "median us/call"
    )
    rows = run(cases, sizes, args.repeats, cuda=args.device == "cuda")
    print()
    print(
        format_table(
            ["op", "size", "torch (us)", "kernel_ops (us)", "ratio"],
            [[r["op"], r["size"], r["torch_us"], r["kernel_ops_us"], f"{r['ratio']:.2f}x"] for r in rows],
        )
    )
    print()
    print("\n".join(summary(rows, targets=args.device == "cpu")))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")
    return 0
