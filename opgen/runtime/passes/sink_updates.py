"""Deferred updates: in-place updates of buffers by a number, which nothing after them reads, run last.

transformers' `StaticCache` keeps a position counter per layer and bumps it (`cumulative_length += n`)
right after that layer's cache write: an in-place add to a one-element buffer in every layer, each an
ATen launch among the layer's generated kernels (where it also keeps the next one from starting early:
`passes.dependent_launch`). Nothing in the step reads a counter after its bump, so the bumps can run
at the end of the step, one after another, where `cache_writes` runs them as one kernel.

An update `add_(B, c)` (c a number) moves to the end of the body (before its `Return`), the updates in
their order, where no line after it reads or writes B's storage (B's views included) and the step
returns none of it. CUDA buffers only: the kernel that takes the run is CUDA's.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Program, Ref, Return, TensorMeta, meta_table, uses
from opgen.runtime.passes.analysis import Groups, alias_groups
from opgen.runtime.registry import KernelRegistry

UPDATES = ("add_scalar_",)  # `add_.Scalar`, as reinplace writes `buffer += number`


def sink_updates(program: Program, registry: KernelRegistry) -> Program:
    body = program.body
    if not body or not isinstance(body[-1], Return):
        return program
    storage, metas = alias_groups(body, registry), meta_table(program)
    moved = [at for at, line in enumerate(body[:-1]) if _on_cuda(line, metas) and _last_touch(body, at, storage)]
    if not moved or moved == list(range(len(body) - 1 - len(moved), len(body) - 1)):
        return program  # none, or already last
    stay = [line for at, line in enumerate(body[:-1]) if at not in moved]
    return replace(program, body=(*stay, *(body[at] for at in moved), body[-1]))


def is_update(line: Line) -> bool:
    """`add_(B, c)`: B, a tensor, updated in place by a number (not a bool), nothing else written."""
    if not isinstance(line, KernelCall) or line.kernel not in UPDATES or line.kwargs or line.outputs:
        return False
    if line.fallback or line.jit or len(line.args) != 2 or not isinstance(line.args[0], Ref):
        return False
    number = line.args[1]
    return line.mutates == (line.args[0].name,) and isinstance(number, int | float) and not isinstance(number, bool)


def _on_cuda(line: Line, metas: dict[str, TensorMeta]) -> bool:
    """An update (`is_update`) of a CUDA tensor."""
    if not is_update(line):
        return False
    meta = metas.get(line.args[0].name)  # type: ignore[union-attr]
    return meta is not None and meta.device.startswith("cuda")


def _last_touch(body: tuple[Line, ...], at: int, storage: Groups) -> bool:
    """No line after `at` (the Return included) uses the storage the update at `at` writes."""
    root = storage.find(body[at].args[0].name)  # type: ignore[union-attr]
    return all(root not in {storage.find(n) for n in uses(line)} for line in body[at + 1 :])
