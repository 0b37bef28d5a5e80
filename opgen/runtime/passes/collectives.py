"""Overlap communication with compute: issue each collective early, wait for it late.

Lowering puts a collective's issue line where the graph calls it and its wait where the graph
first waits (`opgen.runtime.lowering.collectives`). This pass moves:

- each issue (with the lines just before it that make its outputs: the clone or `Alloc`) up to just
  after the last line that defines or writes what it reads, never above another collective line
  (every rank issues its collectives in the same order) nor above the input check or size bindings;
- each wait down to just before the first line that reads or writes one of the collective's outputs,
  or writes one of its inputs, or returns (so a tensor is never read in flight nor changed under
  the collective reading it). Lines that only read its inputs run while it is in flight.

Aliases count: a line touching any value that shares storage with a tensor in flight is a use. The
wait line lists every tensor in flight, so after this pass liveness, memory planning and frees keep
them alive and their buffers unshared until the wait, with no knowledge of collectives.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import (
    Alloc,
    Comment,
    KernelCall,
    Line,
    Program,
    Ref,
    Return,
    TensorMeta,
    View,
    defs,
    substitute_line,
    uses,
)
from opgen.runtime.ir.collectives import issue_kinds, wait_locals
from opgen.runtime.passes.analysis import Groups, alias_groups, is_view_call, last_uses, setup_names, view_roots
from opgen.runtime.registry import KernelRegistry


def overlap_collectives(program: Program, registry: KernelRegistry) -> Program:
    issues, waits = set(issue_kinds(program.collectives)), wait_locals(program.collectives)
    if not issues:
        return program
    body = _forward_copies(list(program.body), issues)
    groups = alias_groups((*program.setup, *program.memo, *body), registry)
    body = _raise_issues(body, issues, issues | waits, groups)
    body = _drop_clones(body, issues, program, registry)
    body = _sink_waits(body, waits, alias_groups((*program.setup, *program.memo, *body), registry))
    return replace(program, body=tuple(body))


def _forward_copies(body: list[Line], issues: set[str]) -> list[Line]:
    """`copy(y, out)` of a collective's output `out` into a tensor of the same meta is `out` itself: how
    an in-place `dist.all_reduce(y)` reaches the graph (functional all_reduce, wait, copy back)."""
    outputs = {n for line in body if _is_call(line, issues) for n in line.mutates}  # type: ignore[union-attr]
    metas = {v.name: v.meta for line in body for v in defs(line) if v.meta is not None}
    mapping: dict[str, Ref] = {}
    kept: list[Line] = []
    for line in body:
        line = substitute_line(line, mapping)
        source = _copied_output(line, outputs, metas)
        if source is not None:
            mapping[line.outputs[0].name] = source  # type: ignore[union-attr]
            continue
        kept.append(line)
    return kept


def _copied_output(line: Line, outputs: set[str], metas: dict[str, TensorMeta]) -> Ref | None:
    """The collective output `copy(y, out)` copies whole into a tensor of its own meta, else None."""
    if not isinstance(line, KernelCall) or line.target != "aten.copy.default" or line.fallback or line.kwargs:
        return None
    if len(line.args) != 2 or len(line.outputs) != 1 or line.outputs[0] is None:
        return None
    dest, source = line.args
    if not isinstance(dest, Ref) or not isinstance(source, Ref) or source.name not in outputs:
        return None
    same = metas.get(dest.name) == metas.get(source.name) == line.outputs[0].meta
    return source if same else None


def _drop_clones(body: list[Line], issues: set[str], program: Program, registry: KernelRegistry) -> list[Line]:
    """An all_reduce or broadcast works in place on a clone of its input; where the input is the body's
    own (made by a kernel call, or a reshape of one: a row-parallel product's `x @ w.T` viewed as
    [1, 1, N]; nothing else sharing its storage) and nothing reads it after the clone, the collective
    works on the input itself."""
    foreign = setup_names(program) | {i.name for i in program.inputs}
    groups = alias_groups((*program.setup, *program.memo, *body), registry)
    last = last_uses(body)
    made = {v.name: line for line in body for v in defs(line)}
    roots = view_roots(body)
    for i, line in enumerate(body):
        if not _is_call(line, issues) or i == 0:
            continue
        clone = body[i - 1]
        if not (isinstance(clone, KernelCall) and clone.kernel == "clone" and clone.target == "aten.clone.default"):
            continue
        out, source = clone.outputs[0], clone.args[0]
        if out is None or not isinstance(source, Ref) or out.name not in line.mutates:  # type: ignore[union-attr]
            continue
        root, members = roots.get(source.name, source.name), groups.members(source.name)
        maker = made.get(root)
        owned = isinstance(maker, KernelCall) and not maker.fallback and not is_view_call(maker, registry)
        meta = next((v.meta for v in defs(made[source.name]) if v.name == source.name), None) if owned else None
        if (
            not owned or set(members) & foreign or any(roots.get(m, m) != root for m in members)
            or last.get(source.name) != i - 1 or any(last.get(m, -1) > i - 1 for m in members)
            or meta is None or meta != out.meta or not meta.is_contiguous()
        ):  # fmt: skip
            continue
        mapping = {out.name: source}
        body[i - 1 :] = [Comment(f"{clone.node}: the collective works on {source.name} in place"),
                         *(substitute_line(b, mapping) for b in body[i:])]  # fmt: skip
    return body


def _is_call(line: Line, locals_: set[str]) -> bool:
    return isinstance(line, KernelCall) and line.jit and line.kernel in locals_


def _storage(names: set[str] | tuple[str, ...], groups: Groups) -> set[str]:
    """Every name sharing storage with one of `names`."""
    return {m for n in names for m in groups.members(n)}


def _raise_issues(body: list[Line], issues: set[str], collective: set[str], groups: Groups) -> list[Line]:
    i = 0
    while i < len(body):
        line = body[i]
        if not _is_call(line, issues):
            i += 1
            continue
        assert isinstance(line, KernelCall)
        start = i  # the block: the lines making its outputs, then the issue
        while start > 0 and set(defs_names(body[start - 1])) & set(line.mutates):
            start -= 1
        block = body[start : i + 1]
        made = {v for b in block for v in defs_names(b)}
        reads = {n for b in block for n in uses(b)} - made
        written = _storage(tuple(n for b in block if isinstance(b, KernelCall) for n in b.mutates), groups)
        read_storage = _storage(reads, groups)
        top = start
        while top > 0 and not _blocks_raise(body[top - 1], reads, read_storage, written, collective, groups):
            top -= 1
        if top < start:
            body[top:top] = body[start : i + 1]
            del body[i + 1 : i + 1 + len(block)]
        i += 1
    return body


def _blocks_raise(
    line: Line, reads: set[str], read_storage: set[str], written: set[str], collective: set[str], groups: Groups
) -> bool:
    """Whether a block may not move above `line`."""
    if not isinstance(line, KernelCall | View | Alloc) or _is_call(line, collective):
        return True  # the input check, size bindings, comments, other collectives: stay below them
    if set(defs_names(line)) & reads:
        return True
    line_writes = _storage(tuple(line.mutates), groups) if isinstance(line, KernelCall) else set()
    return bool(line_writes & (read_storage | written)) or bool(_storage(tuple(uses(line)), groups) & written)


def _sink_waits(body: list[Line], waits: set[str], groups: Groups) -> list[Line]:
    for wait in [line for line in body if _is_call(line, waits)]:
        assert isinstance(wait, KernelCall)
        body.remove(wait)
        work = uses(wait)[0]
        issue = next(k for k, line in enumerate(body) if work in defs_names(line))
        outputs = _storage(tuple(wait.mutates), groups)
        inputs = _storage(tuple(n for n in uses(wait)[1:] if n not in wait.mutates), groups)
        at = issue + 1
        while at < len(body) and not _needs_wait(body[at], outputs, inputs, groups):
            at += 1
        body.insert(at, wait)
    return body


def _needs_wait(line: Line, outputs: set[str], inputs: set[str], groups: Groups) -> bool:
    if isinstance(line, Return):
        return True
    if set(uses(line)) & outputs or set(defs_names(line)) & outputs:
        return True
    writes = _storage(tuple(line.mutates), groups) if isinstance(line, KernelCall) else set()
    return bool(writes & (inputs | outputs))


def defs_names(line: Line) -> tuple[str, ...]:
    return tuple(v.name for v in defs(line))
