"""Argument checks a spec entry can ask for (`checks: [name, ...]`): hand-written C++ helpers in
`csrc/opgen/bind/checks.h`, called by the binding after its arguments are converted and before the kernel.

They exist for kernels that trust their caller: torch's public entry points check these things
before they reach the kernel, but `torch.ops.aten.*` and a direct kernel call do not, and the kernel
then reads out of bounds (a crash, or garbage) instead of raising. Each check names the schema
arguments it takes, in the order its C++ function takes them (after the Signature).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from opgen.spec.model import Schema


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    args: tuple[tuple[str, str], ...]  # (schema argument name, its type), passed in this order
    doc: str

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.args)

    @property
    def cpp_function(self) -> str:
        return f"opgen::checks::{self.name}"


CHECKS = {
    c.name: c
    for c in (
        Check(
            "batch_norm_channels",
            (
                ("input", "Tensor"),
                ("weight", "Tensor?"),
                ("bias", "Tensor?"),
                ("running_mean", "Tensor"),
                ("running_var", "Tensor"),
            ),
            "weight, bias, running_mean and running_var hold input.size(1) elements each",
        ),
        Check(
            "fft_dims",
            (("self", "Tensor"), ("dim", "int[]")),
            "dim names at least one dimension of self, each once (an IndexError or a ValueError otherwise)",
        ),
        Check(
            "batch_norm_out_contiguous",
            (("input", "Tensor"), ("training", "bool")),
            "in training mode on the CPU, input is contiguous (a ValueError otherwise): ATen's CPU out kernel "
            "reads a strided or channels-last input wrongly, in eager torch too",
        ),
        Check(
            "linear_binary_other",
            (("X", "Tensor"), ("other", "Tensor"), ("W", "Tensor")),
            "other has the linear's result shape (X's, with the last size W.size(0)) and is dense",
        ),
        Check(
            "conv_binary_other",
            (
                ("X", "Tensor"),
                ("other", "Tensor"),
                ("W", "Tensor"),
                ("padding", "int[]"),
                ("stride", "int[]"),
                ("dilation", "int[]"),
            ),
            "other has the convolution's result shape and is dense",
        ),
        Check(
            "attention_inputs",
            (("query", "Tensor"), ("key", "Tensor"), ("value", "Tensor")),
            "query, key and value share one dtype (a TypeError otherwise): the fused attention kernels read key "
            "and value as query's dtype",
        ),
        Check(
            "cudnn_attention_head_dim",
            (("query", "Tensor"),),
            "query's head dimension (its last size) is at most 256 (a ValueError otherwise): cuDNN's attention "
            "kernels take no larger one, and a direct call does not refuse it",
        ),
    )
}


def check_problems(value: object, schema: Schema) -> tuple[tuple[str, ...], list[str]]:
    """The check names of a `checks:` value, and what is wrong with it (messages without location)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return (), [f"'checks' must be a list of check names (known: {', '.join(CHECKS)}), not {value!r}"]
    problems = []
    types = {a.name: str(a.type) for a in schema.args}
    for name in value:
        check = CHECKS.get(name)
        if check is None:
            close = difflib.get_close_matches(name, CHECKS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append(f"unknown check {name!r} (known: {', '.join(CHECKS)}){hint}")
        elif wrong := [f"{t} {a}" for a, t in check.args if types.get(a) != t]:
            needs = ", ".join(f"{t} {a}" for a, t in check.args)
            problems.append(f"check '{name}' takes the arguments ({needs}); the schema lacks {', '.join(wrong)}")
    if len(set(value)) != len(value):
        problems.append("'checks' names a check twice")
    return tuple(value), problems
