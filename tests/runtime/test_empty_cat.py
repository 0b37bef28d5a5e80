"""The empty_cat pass: a cat's empty operands dropped, a cat left with one operand a copy (Phi-3's rotary)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import opgen


class PartialRotary(nn.Module):
    """transformers' Phi-3 rotary on the first `rotary` channels of a head, the rest concatenated back."""

    def __init__(self, rotary: int) -> None:
        super().__init__()
        self.rotary = rotary

    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = q[..., : self.rotary], q[..., self.rotary :]
        half = self.rotary // 2
        turned = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        return torch.cat([rot * cos + turned * sin, rest], dim=-1) * 2


class Cats(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, empty: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([a, empty, b], dim=-1), torch.cat([empty, empty], dim=-1)


def cats(fn: object) -> list[str]:
    """The lines of the compiled function's code (not its comments) that call a cat."""
    code = fn.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    return [c for line in code.splitlines() if re.search(r"\bcat(_out)?\(", c := line.split("  # ")[0])]


@pytest.mark.parametrize("rotary", [8, 4], ids=["whole_head", "partial"])
def test_a_cat_with_an_empty_operand_left_is_a_copy(rotary: int) -> None:
    model = PartialRotary(rotary)
    example = (torch.randn(1, 4, 1, 8), torch.randn(1, 1, 1, rotary), torch.randn(1, 1, 1, rotary))
    with torch.no_grad():
        fn = opgen.compile(model, example, cache=False)
        torch.testing.assert_close(fn(*example), model(*example))
    assert len(cats(fn)) == (1 if rotary == 8 else 2), cats(fn)  # rotate_half's; the outer one where not empty


def test_empty_operands_go_and_a_cat_of_nothing_but_empty_ones_stays() -> None:
    model, example = Cats(), (torch.randn(2, 3), torch.randn(2, 4), torch.randn(2, 0))
    with torch.no_grad():
        fn = opgen.compile(model, example, cache=False, passes=["empty_cat"])
        for got, want in zip(fn(*example), model(*example), strict=True):
            torch.testing.assert_close(got, want)
    first, second = cats(fn)
    assert "(a, b)" in first and "empty" not in first, first  # the empty operand dropped
    assert "(empty_, empty_)" in second, second  # nothing left to keep: as it was


def test_as_on_cuda_the_rotation_and_its_copy_are_one_kernel(monkeypatch: pytest.MonkeyPatch,
                                                             request: pytest.FixtureRequest) -> None:  # fmt: skip
    """Phi-3's whole-head rotary, fused as on CUDA: where triton is installed (and no GPU), every config in
    Triton's interpreter, checked against the ATen calls."""
    import importlib.util

    from fusion_interp import compile_as_on_cuda, ran_in_fresh_interpreter

    interpreted = importlib.util.find_spec("triton") is not None and not torch.cuda.is_available()
    if interpreted and ran_in_fresh_interpreter(request):
        return
    model = PartialRotary(8)
    example = (torch.randn(1, 4, 1, 8), torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8))
    checks: list[str] = []
    fn, kernels = compile_as_on_cuda(monkeypatch, model, example, checks if interpreted else None)
    (kernel,) = kernels  # the rotation, its copy (the cat left with one operand) and the scale
    assert {"cat", "cat_1", "mul_2"} <= set(kernel.nodes), kernel.nodes
    with torch.no_grad():
        torch.testing.assert_close(fn(*example), model(*example))
    assert not interpreted or kernel.name in checks
