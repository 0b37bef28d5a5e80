"""Dead code elimination: drop calls whose results nobody reads, unused results, unused constants."""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Comment, KernelCall, Line, Program, SizeLet, defs, uses
from opgen.runtime.registry import KernelRegistry


def _removable(line: Line) -> bool:
    """Size bindings stay: memory planning and the size memo add readers of them after this pass runs."""
    if isinstance(line, KernelCall):
        return not line.fallback and not line.mutates and bool(line.outputs)
    return bool(defs(line)) and not isinstance(line, Comment | SizeLet)


def _sweep(lines: tuple[Line, ...], live: set[str]) -> tuple[Line, ...]:
    kept: list[Line] = []
    for line in reversed(lines):
        if _removable(line) and not any(v.name in live for v in defs(line)):
            continue
        if isinstance(line, KernelCall) and line.unpack:
            line = replace(line, outputs=tuple(v if v is not None and v.name in live else None for v in line.outputs))
        kept.append(line)
        live.update(uses(line))
    return tuple(reversed(kept))


def eliminate_dead_code(program: Program, registry: KernelRegistry) -> Program:
    live: set[str] = set()
    body = _sweep(program.body, live)
    memo = _sweep(program.memo, live)
    setup = _sweep(program.setup, live)
    constants = tuple(c for c in program.constants if c.name in live or c.mutable)
    return replace(program, setup=setup, memo=memo, body=body, constants=constants)
