"""Every kernel_ops function against eager PyTorch (`torch.ops.aten.<op>.<overload>`), on CPU.

The cases come from the registry (`get_kernel_ops_args_info()`), one per bound function and dtype,
with the samples of `samples.py`. Each sample is built twice, once per side, and both sides must
agree on: the results (values, dtype, shape, strides, storage offset), the inputs afterwards (what
was written, and that nothing else was), which results alias which inputs, and that an in-place or
out variant returns the very Python object it wrote into.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import samples
import torch

from opgen import kernel_ops

INFO = kernel_ops.get_kernel_ops_args_info()
Check = Callable[[str, samples.Sample, samples.Sample], None]
Values = bool | tuple[int, ...]  # compare values: all, none, or those of these tuple items


def sample_key(name: str) -> str:
    """The samples of a function are those of its group's functional op (or its own, if none)."""
    return INFO[INFO[name]["functional"] or name]["aten"].removeprefix("aten::")


def aten_op(name: str) -> torch._ops.OpOverload:
    if INFO[name]["aten"] in samples.EAGER:  # one of opgen's own kernels
        return samples.EAGER[INFO[name]["aten"]]
    op, _, overload = INFO[name]["aten"].removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_triton(name: str) -> bool:
    """A Triton op (backend `triton`): tests/jit checks it against Triton's own launch on a GPU."""
    return INFO[name]["backends"] == ["triton"]


def _op_cases() -> Iterator[Any]:
    for name in kernel_ops.get_kernel_op_names():
        spec = None if is_triton(name) else samples.SAMPLES.get(sample_key(name))
        for dtype in spec.dtypes if spec else ():
            yield pytest.param(name, dtype, id=f"{name}-{dtype_id(dtype)}")


OP_CASES = list(_op_cases())


# --- comparisons ----------------------------------------------------------------------------------
def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.dtype, t.device, t.stride(), t.storage_offset())


def assert_same_tensor(actual: torch.Tensor, expected: torch.Tensor, values: bool, what: str) -> None:
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}, eager gave a Tensor"
    assert _meta(actual) == _meta(expected), (
        f"{what}: (shape, dtype, device, stride, storage offset) {_meta(actual)}, eager {_meta(expected)}"
    )
    if values:
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{what}: {m}")


def assert_same_result(actual: Any, expected: Any, values: Values, what: str = "result") -> None:
    if isinstance(expected, torch.Tensor):
        assert_same_tensor(actual, expected, bool(values), what)
        return
    assert type(actual) is type(expected), f"{what}: got {type(actual).__name__}, eager {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} items, eager gave {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_result(a, e, values if isinstance(values, bool) else i in values, f"{what}[{i}]")
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa = a.untyped_storage()
    return sa.nbytes() > 0 and sa.data_ptr() == b.untyped_storage().data_ptr()


def assert_same_aliasing(actual: Any, expected: Any, mine: samples.Sample, ref: samples.Sample) -> None:
    """Each result is (or views) the same inputs on both sides: views stay views, copies copies."""
    inputs = list(zip(_tensors((mine.args, mine.kwargs)), _tensors((ref.args, ref.kwargs))))
    for i, (a, e) in enumerate(zip(_tensors(actual), _tensors(expected))):
        for j, (a_in, e_in) in enumerate(inputs):
            assert (a is a_in) == (e is e_in), f"result tensor {i} is input tensor {j}: {a is a_in}, eager {e is e_in}"
            shared, eager_shared = _shares_storage(a, a_in), _shares_storage(e, e_in)
            assert shared == eager_shared, (
                f"result tensor {i} shares storage with input tensor {j}: {shared}, eager {eager_shared}"
            )


def assert_same_inputs(mine: samples.Sample, ref: samples.Sample) -> None:
    """After the calls, the inputs agree: written where eager writes, untouched elsewhere."""
    pairs = zip(_tensors((mine.args, mine.kwargs)), _tensors((ref.args, ref.kwargs)))
    for j, (a, e) in enumerate(pairs):
        assert_same_tensor(a, e, True, f"input tensor {j} after the call")


# --- calls by variant -----------------------------------------------------------------------------
def _arg(sample: samples.Sample, name: str, arg: str) -> Any:
    if arg in sample.kwargs:
        return sample.kwargs[arg]
    return sample.args[[a["name"] for a in INFO[name]["args"]].index(arg)]


def check_functional(name: str, mine: samples.Sample, ref: samples.Sample, values: Values) -> None:
    actual = getattr(kernel_ops, name)(*mine.args, **mine.kwargs)
    expected = aten_op(name)(*ref.args, **ref.kwargs)
    assert_same_result(actual, expected, values)
    assert_same_inputs(mine, ref)
    assert_same_aliasing(actual, expected, mine, ref)


def check_inplace(name: str, mine: samples.Sample, ref: samples.Sample, values: Values) -> None:
    (target,) = INFO[name]["mutates"]
    actual = getattr(kernel_ops, name)(*mine.args, **mine.kwargs)
    expected = aten_op(name)(*ref.args, **ref.kwargs)
    assert actual is _arg(mine, name, target), f"{name} must return its argument '{target}' itself"
    assert_same_result(actual, expected, values)
    assert_same_inputs(mine, ref)
    assert_same_aliasing(actual, expected, mine, ref)


def check_out(name: str, mine: samples.Sample, ref: samples.Sample, values: Values) -> None:
    """Once into outs of the right shape (as empty_like of eager's result), once into 0-size outs."""
    out_names = [a["name"] for a in INFO[name]["args"] if a.get("out")]
    template = aten_op(INFO[name]["functional"])(*ref.args, **ref.kwargs)
    templates = template if isinstance(template, tuple) else (template,)
    for make in (torch.empty_like, lambda t: t.new_empty(0)):
        outs = {n: make(t) for n, t in zip(out_names, templates)}
        ref_outs = {n: make(t) for n, t in zip(out_names, templates)}
        actual = getattr(kernel_ops, name)(*mine.args, **mine.kwargs, **outs)
        expected = aten_op(name)(*ref.args, **ref.kwargs, **ref_outs)
        returned = actual if len(outs) > 1 else (actual,)
        assert type(returned) is tuple and len(returned) == len(outs), f"{name} returned {type(actual).__name__}"
        for r, (n, o) in zip(returned, outs.items()):
            assert r is o, f"{name} must return its argument '{n}' itself"
        assert_same_result(actual, expected, values)
        assert_same_inputs(mine, ref)


def run_sample(name: str, mine: samples.Sample, ref: samples.Sample, values: Values) -> None:
    match INFO[name]["variant"]:
        case "functional":
            check_functional(name, mine, ref, values)
        case "inplace":
            check_inplace(name, mine, ref, values)
        case "out":
            check_out(name, mine, ref, values)
        case variant:
            raise AssertionError(f"{name}: unknown variant {variant!r}")


def _run_with_context(name: str, index: int, mine: samples.Sample, ref: samples.Sample, check: Check) -> None:
    try:
        check(name, mine, ref)
    except Exception as e:
        raise AssertionError(f"kernel_ops.{name}, sample {index}: {mine!r}: {e}") from e


def has_kernel(name: str, device: str) -> bool:
    return device in INFO[name]["backends"] or "default" in INFO[name]["backends"]


def raises_like_eager(name: str, mine: samples.Sample, ref: samples.Sample) -> None:
    """Where the build binds no kernel for the device, both sides refuse it (ATen has none either)."""
    with pytest.raises(NotImplementedError, match=rf"^kernel_ops\.{name}\(\): has no kernel for device type"):
        getattr(kernel_ops, name)(*mine.args, **mine.kwargs)
    with pytest.raises(NotImplementedError):
        aten_op(name)(*ref.args, **ref.kwargs)


def check_op(name: str, dtype: torch.dtype, device: str, move: Callable[[samples.Sample], samples.Sample]) -> None:
    """Every sample of the function, moved to `device`, checked against eager."""
    spec = samples.SAMPLES[sample_key(name)]
    variant = INFO[name]["variant"]
    values = spec.values if spec.values_of is None else spec.values_of
    check = partial(run_sample, values=values) if has_kernel(name, device) else raises_like_eager
    checked = 0
    for index, (mine, ref) in enumerate(zip(spec.build(dtype), spec.build(dtype))):
        if mine.applies_to(variant):
            _run_with_context(name, index, move(mine), move(ref), check)
            checked += 1
    assert checked, f"no sample of {sample_key(name)!r} applies to {name} ({variant})"


# --- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "dtype"), OP_CASES)
def test_op(name: str, dtype: torch.dtype) -> None:
    check_op(name, dtype, "cpu", lambda sample: sample)


# --- inputs that only the dispatcher handles -------------------------------------------------------
# kernel_ops skips the dispatcher, so a tensor that relies on a dispatch key to be read correctly
# (a negative or conjugate bit, a Python subclass, a fake or functional tensor) is refused by the
# binding with a TypeError naming the argument: never a wrong result or a crash.
def _with_bit(tree: Any, bit: str) -> Any:
    """The same values, held by a view with the negative (real) or conjugate (complex) bit set."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_with_bit(item, bit) for item in tree)
    if not isinstance(tree, torch.Tensor) or not tree.is_floating_point():
        return tree
    if bit == "neg":  # -(-x), with the negative bit (as `z.conj().imag` makes, but with x's strides)
        return torch._neg_view(-tree)
    return torch.complex(tree, tree / 2).conj_physical().conj()  # conj(conj(v)), with the conjugate bit


def _raises_for_lazy_bit(name: str, mine: samples.Sample, ref: samples.Sample) -> None:
    with pytest.raises(TypeError, match=r"^kernel_ops\.\w+\(\): argument '\w+' has a lazy (negation|conjugation) bit"):
        getattr(kernel_ops, name)(*mine.args, **mine.kwargs)


@pytest.mark.parametrize(
    ("name", "bit"),
    [
        ("add", "neg"),
        ("exp", "neg"),
        ("amax", "neg"),
        ("cat", "neg"),
        ("index_select", "neg"),
        ("add", "conj"),
        ("exp", "conj"),
        ("sum_dim", "conj"),
    ],
)
def test_lazy_bit_input(name: str, bit: str) -> None:
    spec = samples.SAMPLES[sample_key(name)]
    for index, (mine, ref) in enumerate(zip(spec.build(torch.float32), spec.build(torch.float32))):
        mine, ref = (samples.Sample(_with_bit(s.args, bit), s.kwargs) for s in (mine, ref))
        if any(t.is_neg() or t.is_conj() for t in _tensors(mine.args)):
            _run_with_context(name, index, mine, ref, _raises_for_lazy_bit)


SUBCLASS_SCRIPT = """
import torch
from opgen import kernel_ops

class Wrapper(torch.Tensor):  # storage-less, like most __torch_dispatch__ subclasses
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a.elem if isinstance(a, Wrapper) else a
        return func(*map(unwrap, args), **(kwargs or {}))

def make(kind):
    x = torch.randn(3, 4)
    if kind == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode
        return FakeTensorMode().from_tensor(x)
    return torch._to_functional_tensor(x) if kind == "functional" else Wrapper(x)

x = make(KIND)
for call in (lambda: kernel_ops.exp(x), lambda: kernel_ops.add(x, x)):
    try:
        call()
        print("returned", flush=True)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
        print("raised", type(e).__name__, flush=True)
"""


@pytest.mark.parametrize("kind", ["fake", "functional", "wrapper_subclass"])
def test_storage_less_input_raises(kind: str) -> None:
    """Run in a child process, so that a crash fails the test instead of killing pytest."""
    script = SUBCLASS_SCRIPT.replace("KIND", repr(kind))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the process died (exit code {done.returncode}); output: {done.stdout!r}"
    lines = done.stdout.splitlines()
    assert lines == ["raised TypeError", "raised TypeError"], done.stdout


def test_every_op_has_samples() -> None:
    covered = {case.values[0] for case in OP_CASES}
    names = [n for n in kernel_ops.get_kernel_op_names() if not is_triton(n)]
    missing = [f"{n} (key {sample_key(n)!r})" for n in names if n not in covered]
    assert not missing, f"kernel_ops functions with no samples in tests/ops/samples.py: {', '.join(missing)}"


def test_no_stale_samples() -> None:
    keys = {sample_key(n) for n in kernel_ops.get_kernel_op_names()}
    stale = sorted(set(samples.SAMPLES) - keys)
    assert not stale, f"samples.py has entries for ops that kernel_ops does not bind: {stale}"


def test_dtype_policy() -> None:
    """float32 and at least one other dtype, except where float32 does not apply."""
    wrong = [
        key
        for key, spec in samples.SAMPLES.items()
        if (
            key not in samples.OWN_SAMPLES  # oneDNN's kernels: float32 (bfloat16 needs CPU support)
            and len(set(spec.dtypes)) < 2
        )
        or (torch.float32 in spec.dtypes) == (key in samples.NO_FLOAT32)
    ]
    assert not wrong, f"samples.py entries that break the dtype policy: {wrong}"


def test_variants_share_functional_args() -> None:
    """The samples of a group fit every function of it: same arguments, plus the out arguments."""

    def names(n: str) -> list[str]:
        return [a["name"] for a in INFO[n]["args"] if not a.get("out")]

    differ = [n for n, info in INFO.items() if info["functional"] and names(n) != names(info["functional"])]
    assert not differ, f"variants whose arguments differ from their functional op's: {differ}"


def test_triton_ops_refuse_cpu_tensors() -> None:
    """A Triton kernel reads device pointers: CPU tensors are a clear error naming the op (a CPU
    build: for want of a launcher; a CUDA build: naming the argument)."""
    names = [n for n in kernel_ops.get_kernel_op_names() if is_triton(n)]
    assert "triton_add" in names
    no_launcher = "runs a Triton kernel: it needs opgen built against a CUDA torch, a GPU and triton installed"
    expected = rf"^kernel_ops\.triton_add\(\): ({no_launcher}$|argument 'self' is on cpu)"
    with pytest.raises(RuntimeError, match=expected):
        kernel_ops.triton_add(torch.ones(3), torch.ones(3), alpha=2)
