"""Fused kernels that store their values where a chain of data movements puts them (fusion.placement):
Swin's window partition (`layer_norm -> roll -> view -> permute -> clone`) and window reverse (`bias
add -> view -> permute -> clone -> view -> roll -> residual add`) without their copies.

As in test_lift_views, the program is relabelled as CUDA around the GPU passes on the CPU; kernels are
bound to their ATen calls, or, where triton is installed and there is no GPU, run in Triton's
interpreter with every config and checked against them. With a GPU the models run for real.
"""

from __future__ import annotations

import re

import pytest
import torch
from fusion_interp import compile_as_on_cuda, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.codegen.triton.placement import Index, placed_address
from opgen.runtime.ir import FusedKernel, Placement

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Partition(nn.Module):
    """Swin's block head: layer norm over (B, H, W, C), an optional shift, windows of `ws` x `ws`."""

    def __init__(self, width: int = 8, ws: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.norm, self.qkv, self.ws, self.shift = nn.LayerNorm(width), nn.Linear(width, 3 * width), ws, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        y = self.norm(x)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), (1, 2))
        y = y.view(b, h // self.ws, self.ws, w // self.ws, self.ws, c).permute(0, 1, 3, 2, 4, 5).contiguous()
        return self.qkv(y.view(-1, self.ws * self.ws, c))


class Reverse(nn.Module):
    """Swin's attention tail: projection, windows back to (B, H, W, C), the shift undone, residual add,
    layer norm."""

    def __init__(self, width: int = 8, ws: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.proj, self.norm, self.ws, self.shift = nn.Linear(width, width), nn.LayerNorm(width), ws, shift

    def forward(self, windows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        y = self.proj(windows).view(b, h // self.ws, w // self.ws, self.ws, self.ws, c)
        y = y.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, c)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), (1, 2))
        return self.norm(x + y)


class Flat(nn.Module):
    """A roll over the flattened tensor of a pointwise result, returned; `other`: the result is also
    read by a product, so the kernel writes it too."""

    def __init__(self, other: bool = False) -> None:
        super().__init__()
        self.other = other

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        y = torch.sigmoid(x) * 2
        rolled = torch.roll(y, 5)
        return (rolled, y @ w) if self.other else rolled


class ReturnedView(nn.Module):
    """The chain's view is returned as well: the chain stops before it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = (x * 2 + 1).permute(0, 2, 1)
        return v, v.contiguous()


compiled = compile_as_on_cuda  # split_bias, lift_views and fusion as on CUDA


def check(fn: object, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        got, want = fn(*inputs), model(*inputs)  # type: ignore[operator]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert g.stride() == w.stride()


CASES = {
    "partition": lambda: (Partition(), (torch.randn(2, 8, 8, 8),)),
    "partition_unshifted": lambda: (Partition(shift=0), (torch.randn(2, 8, 8, 8),)),
    "reverse": lambda: (Reverse(), (torch.randn(8, 16, 8), torch.randn(2, 8, 8, 8))),
    "flat": lambda: (Flat(), (torch.randn(3, 5), torch.randn(5, 4))),
    "flat_and_product": lambda: (Flat(other=True), (torch.randn(3, 5), torch.randn(5, 4))),
}


def nodes(kernels: list[FusedKernel]) -> set[str]:
    """The graph nodes the kernels cover, by op (`permute_1` -> `permute`)."""
    return {re.sub(r"_\d+$", "", n) for k in kernels for n in k.nodes}


def test_the_window_partition_is_stored_by_the_layer_norm_kernel(monkeypatch) -> None:
    model, inputs = CASES["partition"]()
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels
    assert {"native_layer_norm", "roll", "permute", "clone"} <= nodes([kernel])
    forward = fn.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    assert "roll(" not in forward and "copy_(" not in forward  # neither the shift nor the partition copies
    assert " % 8" in kernel.source  # the shift: modulo the rolled dimension's size
    check(fn, model, inputs)


def test_an_unshifted_partition_joins_a_lone_layer_norm(monkeypatch) -> None:
    model, inputs = CASES["partition_unshifted"]()
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels  # one node and its copy: a kernel for the layer norm that it was not alone
    assert {"native_layer_norm", "permute", "clone"} <= nodes([kernel])
    check(fn, model, inputs)


def test_the_window_reverse_and_shift_are_one_kernel(monkeypatch) -> None:
    model, inputs = CASES["reverse"]()
    fn, kernels = compiled(monkeypatch, model, inputs)
    assert {"clone", "roll"} <= nodes(kernels)  # the copy out of the permuted product, and the shift
    forward = fn.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    assert "roll(" not in forward and "copy_(" not in forward
    check(fn, model, inputs)


@pytest.mark.parametrize("other", [False, True], ids=["alone", "also_read"])
def test_a_roll_of_the_flattened_tensor(monkeypatch, other) -> None:
    model, inputs = CASES["flat_and_product" if other else "flat"]()
    fn, kernels = compiled(monkeypatch, model, inputs)
    (kernel,) = kernels
    assert "roll" in nodes([kernel]) and len(kernel.outputs) == (2 if other else 1)  # y stored too where read
    check(fn, model, inputs)


def test_a_chain_stops_at_a_value_read_elsewhere(monkeypatch) -> None:
    model, inputs = ReturnedView(), (torch.randn(2, 3, 5),)
    fn, kernels = compiled(monkeypatch, model, inputs)
    # The permute is returned: the copy reads it, not the add's kernel. (The copy of that strided view
    # is a kernel of its own, as any lone strided copy is.)
    assert len(kernels) == 2 and {"add", "clone"} - nodes(kernels[:1]) == {"clone"}
    assert nodes(kernels[1:]) == {"clone"}
    check(fn, model, inputs)


def test_cpu_programs_keep_roll_as_one_kernel() -> None:
    model, inputs = CASES["partition"]()
    with torch.no_grad():
        fn = opgen.compile(model.eval(), inputs, cache=False)
        torch.testing.assert_close(fn(*inputs), model(*inputs))
    source = fn.artifact.source  # type: ignore[attr-defined]
    assert "roll(" in source and "index_select" not in source and not fn.artifact.fused  # type: ignore[attr-defined]


def test_addresses_follow_reshape_permute_and_roll() -> None:
    """Each element's address, computed by evaluating the expressions, is where torch puts it."""
    shape = (2, 4, 6)
    moves = (("roll", (1, 5), (1, 2)), ("reshape", (2, 2, 2, 3, 2), ()), ("permute", (0, 1, 3, 2, 4), ()))
    x = torch.arange(48).reshape(shape)
    moved = x.roll((1, 5), (1, 2)).reshape(2, 2, 2, 3, 2).permute(0, 1, 3, 2, 4).contiguous()
    meta = opgen.runtime.ir.TensorMeta(tuple(moved.shape), tuple(moved.stride()), "int64", "cuda:0")
    text = placed_address(Index(shape, linear="offs"), Placement("y", moves), meta)  # type: ignore[arg-type]
    for offs in range(48):
        assert moved.flatten()[eval(text, {"offs": offs})] == x.flatten()[offs]


@needs_triton
@pytest.mark.parametrize("what", list(CASES))
def test_the_placed_kernels_run_in_the_interpreter(monkeypatch, request, what) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model, inputs = CASES[what]()
    checks: list[str] = []
    fn, kernels = compiled(monkeypatch, model, inputs, checks)
    check(fn, model, inputs)
    assert kernels and len(checks) >= len(kernels)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("what", ["partition", "reverse"])
def test_on_the_gpu_windows_move_without_copies(dtype, what) -> None:
    model, inputs = CASES[what]()
    model = model.eval().cuda().to(dtype)
    inputs = tuple(t.cuda().to(dtype) for t in inputs)
    with torch.no_grad():
        fn = opgen.compile(model, inputs, cache=False)
        want, got = model(*inputs), fn(*inputs)
    tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert "roll" in nodes(fn.artifact.fused)  # type: ignore[attr-defined]
