"""Bugs the call fuzzer found in the bindings, each as the call that found it (in a child process:
before the fix, the first one crashed the interpreter)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import torch
from opgen import kernel_ops as k
a = torch.ones(2)
calls = (
    lambda: k.add(a, a, **{"\udc80": 1}),          # keyword that UTF-8 cannot encode: was a segfault
    lambda: k.gelu(a, approximate="\udc80"),          # str argument likewise: was a bare UnicodeEncodeError
    lambda: k.layer_norm(a, [2], eps=2**70),          # an int that fits a float but not int64
    lambda: k.layer_norm(a, [2], eps=2**2000),        # an int no float holds
)
for call in calls:
    try:
        r = call()
        print("returned", type(r).__name__)
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def test_fuzzer_found_binding_bugs() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    assert done.stdout.splitlines() == [
        "TypeError kernel_ops.add(): got an unexpected keyword argument '\\udc80'",
        "ValueError kernel_ops.gelu(): argument 'approximate' is not valid UTF-8 text",
        "returned Tensor",
        "OverflowError kernel_ops.layer_norm(): argument 'eps' does not fit in a float",
    ]


def test_scalar_arguments_refuse_tensors_as_eager_does() -> None:
    """The fuzzer's `accepted` findings: a one-element tensor passed for a `Scalar` was taken (by
    .item()) where torch.ops.aten refuses any tensor. Every Scalar argument of every function now
    refuses it, 0-dim or not, with a TypeError naming the function and the argument."""
    import torch
    from call_recipes import Recipe, materialize, sample_key, samples

    from opgen import kernel_ops

    checked = 0
    for name in kernel_ops.get_kernel_op_names():
        info = kernel_ops.get_kernel_op_info(name)
        spec = samples.SAMPLES.get(sample_key(name))
        for position, arg in enumerate(info["args"]):
            if arg["type"] not in ("Scalar", "Scalar?") or spec is None:
                continue
            for tensor in (torch.tensor(2.0), torch.tensor([2])):
                args, kwargs = materialize(Recipe(name, spec.dtypes[0], 0, (), seed=1))
                if position < len(args):
                    args[position] = tensor
                else:
                    kwargs[arg["name"]] = tensor
                try:
                    getattr(kernel_ops, name)(*args, **kwargs)
                except TypeError as exc:
                    expected = (
                        f"kernel_ops.{name}(): argument '{arg['name']}' (position {position + 1}) must be a number"
                    )
                    assert str(exc).startswith(expected), str(exc)
                else:
                    raise AssertionError(f"kernel_ops.{name} took a tensor for Scalar '{arg['name']}'")
                checked += 1
    assert checked >= 40, checked  # add/sub/mul/div/pow/clamp/fill/leaky_relu/elu/softplus/... with variants


BATCH_NORM = r"""
import torch
from opgen import kernel_ops as k
C = 40_000_000  # past the end of a one-element tensor far enough to fault, as eager did
x, stats = torch.zeros(1, C, 1, 1), torch.zeros(C)
calls = (
    lambda: k._native_batch_norm_legit_no_training(x, torch.tensor(1.0), None, stats, stats, 0.1, 1e-5),
    lambda: k._native_batch_norm_legit_no_training(x, None, torch.ones(2), stats, stats, 0.1, 1e-5),
    lambda: k._native_batch_norm_legit_no_training(x, None, None, stats[:5], stats, 0.1, 1e-5),
    lambda: k._native_batch_norm_legit_no_training(x, None, None, stats, torch.ones(()), 0.1, 1e-5),
    # training writes running_mean[c] for every channel: was heap corruption (the fuzzer's racy tensor)
    lambda: k._native_batch_norm_legit(x, None, None, torch.zeros(3), stats, True, 0.1, 1e-5),
)
for call in calls:
    try:
        call()
        print("returned")
    except Exception as exc:
        print(type(exc).__name__, exc)
x, w = torch.randn(2, 3, 4, 4), torch.randn(3)
got = k._native_batch_norm_legit_no_training(x, w, w, w.abs(), w.abs(), 0.1, 1e-5)[0]
want = torch.ops.aten._native_batch_norm_legit_no_training.default(x, w, w, w.abs(), w.abs(), 0.1, 1e-5)[0]
print("valid call matches eager:", torch.equal(got, want))
"""


def test_batch_norm_refuses_per_channel_tensors_of_the_wrong_size() -> None:
    """The fuzzer's `wrong` findings: a 0-dim bias made kernel_ops and eager differ, because the
    kernel (eager's too) reads bias[c] for every channel c: out of bounds, garbage, or a segfault for
    enough channels. The binding now checks the sizes (`checks: [batch_norm_channels]` in ops.yaml)."""
    done = subprocess.run([sys.executable, "-c", BATCH_NORM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    prefix = "ValueError kernel_ops._native_batch_norm_legit_no_training(): argument"
    assert done.stdout.splitlines() == [
        f"{prefix} 'weight' must hold input.size(1) = 40000000 elements, not 1",
        f"{prefix} 'bias' must hold input.size(1) = 40000000 elements, not 2",
        f"{prefix} 'running_mean' must hold input.size(1) = 40000000 elements, not 5",
        f"{prefix} 'running_var' must hold input.size(1) = 40000000 elements, not 1",
        "ValueError kernel_ops._native_batch_norm_legit(): argument 'running_mean' must hold input.size(1) = "
        "40000000 elements, not 3",
        "valid call matches eager: True",
    ]


def test_batch_norm_out_refuses_a_strided_input_in_training() -> None:
    """The fuzzer's `wrong` finding: `_native_batch_norm_legit.out` in training mode on the CPU reads a
    strided or channels-last input as if contiguous (wrong results and uninitialized save_mean, in
    eager torch.ops.aten too). `checks: [batch_norm_out_contiguous]` refuses it; eval mode, the
    functional variant and a contiguous input are unchanged."""
    import torch

    from opgen import kernel_ops as k

    def outs() -> dict[str, torch.Tensor]:
        return {"out": torch.empty(0), "save_mean": torch.empty(0), "save_invstd": torch.empty(0)}

    x = torch.randn(2, 3, 8)[..., ::2]
    for strided in (x, torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)):
        with pytest.raises(ValueError, match="argument 'input' must be contiguous in training mode"):
            k._native_batch_norm_legit_out(
                strided, None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5, **outs()
            )
    want = torch.ops.aten._native_batch_norm_legit(
        x.contiguous(), None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5
    )
    for got in (
        k._native_batch_norm_legit_out(
            x.contiguous(), None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5, **outs()
        ),
        k._native_batch_norm_legit(x, None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5),
    ):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    k._native_batch_norm_legit_out(x, None, None, torch.zeros(3), torch.ones(3), False, 0.1, 1e-5, **outs())


FFT = r"""
import torch
from opgen import kernel_ops as k
x, z = torch.randn(3, 4, 5), torch.randn(3, 4, 5, dtype=torch.complex64)
calls = (
    lambda: k._fft_r2c_out(x, [-2, -2], 0, True, out=torch.empty(0, dtype=torch.complex64)),  # was a segfault
    lambda: k._fft_r2c(x, [1, -2], 0, True),
    lambda: k._fft_c2r(z, [0, 2, -1], 0, 8),
    lambda: k._fft_r2c(x, [3], 0, True),
    lambda: k._fft_c2r(z, [], 0, 8),
)
for call in calls:
    try:
        call()
        print("returned")
    except Exception as exc:
        print(type(exc).__name__, exc)
got, want = k._fft_r2c(x, [0, 2], 2, True), torch.ops.aten._fft_r2c(x, [0, 2], 2, True)
print("valid call matches eager:", torch.equal(got, want))
"""


def test_fft_refuses_repeated_and_out_of_range_dims() -> None:
    """The fuzzer's crash: `_fft_r2c_out` with dim [-2, -2] segfaulted, as `torch.ops.aten._fft_r2c`
    does, because the kernels trust `dim`. The bindings check it (`checks: [fft_dims]` in ops.yaml)."""
    done = subprocess.run([sys.executable, "-c", FFT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    assert done.stdout.splitlines() == [
        "ValueError kernel_ops._fft_r2c_out(): argument 'dim' names dimension 1 twice",
        "ValueError kernel_ops._fft_r2c(): argument 'dim' names dimension 1 twice",
        "ValueError kernel_ops._fft_c2r(): argument 'dim' names dimension 2 twice",
        "IndexError kernel_ops._fft_r2c(): argument 'dim': dimension 3 is out of range for a tensor of 3 dimensions",
        "ValueError kernel_ops._fft_c2r(): argument 'dim' must name at least one dimension",
        "valid call matches eager: True",
    ]


PADS = r"""
import torch
from opgen import kernel_ops as k
calls = {
    "reflection_pad2d_out": (lambda x: ([1, 1, 1, 1],), (1, 3, 4)),
    "replication_pad2d_out": (lambda x: ([1, 1, 1, 1],), (1, 3, 4)),
    "reflection_pad3d_out": (lambda x: ([1, 1, 1, 1, 1, 1],), (1, 3, 3, 3)),
    "_adaptive_avg_pool2d_out": (lambda x: ([5, 7],), (1, 3, 4)),
}
for name, (extra, shape) in calls.items():
    fn, functional = getattr(k, name), getattr(torch.ops.aten, name[:-4])
    for _ in range(200):  # the heap corruption showed within a few calls
        x = torch.randn(*shape, dtype=torch.float64)
        for out in (x, x.view(-1), x[0]):
            try:
                fn(x, *extra(x), out=out)
                print("returned")
            except ValueError as exc:
                last = str(exc)
    fresh = fn(x, *extra(x), out=torch.empty(0, dtype=torch.float64))
    print(last)
    print("separate out matches eager:", torch.equal(fresh, functional(x, *extra(x))))
"""


def test_out_variants_refuse_an_out_sharing_an_input() -> None:
    """The fuzzer's crashes: `reflection_pad2d_out(x, p, out=x)` (and replication_pad2d, reflection_pad3d)
    resizes out, freeing x's memory, then reads x (heap corruption; eager torch.ops.aten does the same).
    Every out variant now refuses an out sharing memory with an input; `_adaptive_avg_pool2d_out`
    stands for the rest (it survives eager's aliasing, but the rule is one for all)."""
    done = subprocess.run([sys.executable, "-c", PADS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    refused = (
        "argument 'out' shares memory with argument 'self': an out variant writes separate outputs (a kernel "
        "that resizes its output would free the input's memory before reading it); use the in-place variant "
        "to write an input"
    )
    assert done.stdout.splitlines() == [
        f"kernel_ops.{name}(): {refused}" if i == 0 else "separate out matches eager: True"
        for name in (
            "reflection_pad2d_out",
            "replication_pad2d_out",
            "reflection_pad3d_out",
            "_adaptive_avg_pool2d_out",
        )
        for i in range(2)
    ]


def test_fuzz_oracle_knows_what_eager_leaves_undefined() -> None:
    """The fuzzer's other findings were its oracle's: kernel_ops and eager agreed, but the oracle
    compared uninitialized memory (a resize that grows a tensor; an out argument that aliases an input
    and is reallocated before the kernel reads it) or refused what the spec documents (one int for a
    `SymInt[N]` argument, repeated N times, which torch.ops.aten takes only for `int[N]`)."""
    import call_fuzz
    import torch
    from call_recipes import Recipe

    found = [
        Recipe("bmm_out", torch.float64, 0, (("alias", 0, 2, False),), seed=1404),
        Recipe(
            "resize_",
            torch.float32,
            1,
            (("tensor", 1, "dtype", torch.float16), ("tensor", 0, "zero_dim", torch.float16)),
            seed=8630,
        ),
        Recipe("adaptive_avg_pool2d", torch.float32, 0, (("value", 1, 0), ("value", 1, 387)), seed=65536),
        Recipe(
            "_adaptive_avg_pool3d",
            torch.float64,
            1,
            (("tensor", 1, "dtype", torch.int32), ("tensor", 1, "empty", torch.int32), ("value", 1, 2)),
            seed=4370,
        ),
    ]
    tally = call_fuzz.Tally()
    for recipe in found:
        call_fuzz.check(recipe, tally, torch.ones(3, 4))
    assert tally.failures == [], tally.failures
    # bmm_out with out aliasing self is refused up front now, like every out sharing an input.
    assert tally.counts["refused_alias"] == 1, tally.counts
    assert tally.counts["both_ok"] + tally.counts["both_raised"] == len(found) - 1, tally.counts
