"""What the entry points take and give back: example inputs checked as tensors, outputs rebuilt from a tree."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgen.runtime.errors import InputTypeError


def example_tensors(example_inputs: Iterable[torch.Tensor], where: str, why: str) -> tuple[torch.Tensor, ...]:
    """`example_inputs` as a tuple of tensors (a lone tensor is one input); an `InputTypeError` naming
    the first that is not a tensor, from `where` ("opgen.compile"), followed by `why`."""
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    for i, value in enumerate(inputs, start=1):
        if not isinstance(value, torch.Tensor):
            raise InputTypeError(f"{where}: example input {i} is {type(value).__name__}; {why}")
    return inputs


def unflattener(spec: pytree.TreeSpec) -> Callable[[tuple[Any, ...]], Any]:
    """Outputs as the model returned them, from the flat tuple the compiled function makes."""
    return lambda flat: pytree.tree_unflatten(list(flat), spec)
