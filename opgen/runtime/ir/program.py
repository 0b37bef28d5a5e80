"""A compiled graph as a whole: its inputs, the constants it binds and its lines (`opgen.runtime.ir.lines`),
with the records of the kernels it launches beyond kernel_ops (`opgen.runtime.ir.kernels`).

A `Program` is a function's inputs, the tensor constants it binds, `setup` lines that run once when
the executor binds the program (allocations of persistent buffers, folded constants, hoisted
views), `memo` lines that run in the call only when the size symbols they read change (dynamic
shapes: views and constant-only calls whose sizes are symbolic) and `body` lines that run on every
call. It lives apart from the lines so that the kernel records, which hold lines, sit between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from opgen.runtime.ir.collectives import Collective
from opgen.runtime.ir.kernels import FusedKernel, JitKernelSpec, KernelChoice
from opgen.runtime.ir.lines import Input, Line, SizeLet, TensorConstant, TensorMeta, defs, uses


@dataclass(frozen=True, slots=True)
class Program:
    name: str
    inputs: tuple[Input, ...]
    constants: tuple[TensorConstant, ...]
    setup: tuple[Line, ...]
    body: tuple[Line, ...]
    notes: tuple[str, ...] = ()  # what passes did or skipped that `report()` should say (symbolic sizes)
    ranges: tuple[tuple[str, int, int | None], ...] = ()  # size symbols: (name, low, high or None)
    jit_kernels: tuple[JitKernelSpec, ...] = ()
    choices: tuple[KernelChoice, ...] = ()
    memo: tuple[Line, ...] = ()  # run in the call only when the size symbols they read change (passes.memo)
    splits: tuple[tuple[str, int], ...] = ()  # (symbol, n): a pass chose per call by `symbol < n` (size_classes)
    fused: tuple[FusedKernel, ...] = ()  # Triton kernels of fused node groups (passes.fusion)
    collectives: tuple[Collective, ...] = ()  # torch.distributed collectives it issues and waits for


def program_lines(program: Program) -> tuple[Line, ...]:
    """Every line of a program: setup, the size memo, body."""
    return (*program.setup, *program.memo, *program.body)


def symbol_names(program: Program) -> set[str]:
    """Names bound to a size per call: the body's `SizeLet`s and torch.compile's size inputs."""
    lets = {line.name for line in program.body if isinstance(line, SizeLet)}
    return lets | {i.name for i in program.inputs if i.size is not None}


def memo_key(program: Program) -> tuple[str, ...]:
    """The size symbols the memo lines read, sorted: the memo is recomputed when one of them changes."""
    symbols = symbol_names(program)
    return tuple(sorted({n for line in program.memo for n in uses(line) if n in symbols}))


def meta_table(program: Program) -> dict[str, TensorMeta]:
    """The meta of every named tensor value of a program."""
    table = {i.name: i.meta for i in program.inputs if i.size is None and not i.opaque}
    table.update((c.name, c.meta) for c in program.constants)
    for line in program_lines(program):
        table.update((v.name, v.meta) for v in defs(line) if v.meta is not None)
    return table


def map_body(program: Program, fn: Callable[[Line], Line]) -> Program:
    return replace(program, body=tuple(fn(line) for line in program.body))
