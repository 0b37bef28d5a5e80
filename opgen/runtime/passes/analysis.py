"""Facts passes share: uses, last uses, which values alias which, which escape to the caller."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from opgen.runtime.ir import (
    Arg,
    Constant,
    KernelCall,
    Line,
    Program,
    Ref,
    Return,
    TensorMeta,
    View,
    defs,
    meta_table,
    program_lines,
    refs,
    uses,
)
from opgen.runtime.registry import KernelRegistry, OpInfo


def use_counts(lines: Iterable[Line | None]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in lines:
        if line is not None:
            counts.update(uses(line))
    return counts


def readers(lines: Sequence[Line]) -> dict[str, set[int]]:
    """Value name -> the indices of the lines reading it (a Return included)."""
    found: dict[str, set[int]] = {}
    for i, line in enumerate(lines):
        for name in uses(line):
            found.setdefault(name, set()).add(i)
    return found


def defined_at(lines: Sequence[Line]) -> dict[str, int]:
    """Value name -> the index of the call defining it (`readers`' other half)."""
    return {v.name: i for i, line in enumerate(lines) if isinstance(line, KernelCall) for v in line.outputs if v}


def writes_between(lines: Sequence[Line], start: int, end: int) -> bool:
    """Whether a line in `lines[start:end]` may write memory (`writes_memory`)."""
    return any(writes_memory(line) for line in lines[start:end])


def writes_memory(line: Line) -> bool:
    """A call that may write memory besides its fresh outputs (in-place and out= calls, ATen fallbacks,
    Triton kernels): nothing is moved, fused or grouped across it."""
    return isinstance(line, KernelCall) and bool(line.mutates or line.fallback or line.jit)


def last_uses(lines: Sequence[Line]) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        for name in uses(line):
            last[name] = i
    return last


def setup_names(program: Program) -> set[str]:
    """Values that exist before the first call: constants and whatever setup defines."""
    names = {c.name for c in program.constants}
    for line in program.setup:
        names.update(v.name for v in defs(line))
    return names


def constant_names(program: Program) -> set[str]:
    """Non-mutable tensor constants and the setup values computed from them alone."""
    constant = {c.name for c in program.constants if not c.mutable}
    for line in program.setup:
        if isinstance(line, Constant) or (isinstance(line, KernelCall) and set(uses(line)) <= constant):
            constant.update(v.name for v in defs(line))
    return constant


def rewrite_body(program: Program, rewrite: Callable[[Line, dict[str, TensorMeta]], Line]) -> Program:
    """`program` with each line of its body replaced by `rewrite(line, metas)` (the program's metas); the
    program itself where no line changes."""
    metas = meta_table(program)
    body = tuple(rewrite(line, metas) for line in program.body)
    return program if body == program.body else replace(program, body=body)


def info_of(line: KernelCall, registry: KernelRegistry) -> OpInfo | None:
    return None if line.fallback else registry.by_name.get(line.kernel)


def arg_value(line: KernelCall, info: OpInfo, name: str) -> Arg:
    """The value a call passes for a schema argument (its default if the call leaves it out)."""
    positional = [a.name for a in info.args if not a.kwarg_only]
    if name in positional and positional.index(name) < len(line.args):
        return line.args[positional.index(name)]
    return dict(line.kwargs).get(name, info.arg(name).default)


def with_arg(line: KernelCall, info: OpInfo, name: str, value: Arg) -> KernelCall:
    """The call passing `value` for a schema argument: where it passes it now, else as a keyword."""
    positional = [a.name for a in info.args if not a.kwarg_only]
    if name in positional and positional.index(name) < len(line.args):
        at = positional.index(name)
        return replace(line, args=(*line.args[:at], value, *line.args[at + 1 :]))
    kwargs = dict(line.kwargs)
    kwargs[name] = value
    return replace(line, kwargs=tuple(kwargs.items()))


def alias_sources(line: Line, registry: KernelRegistry) -> tuple[str, ...]:
    """Names whose storage the values `line` defines may share (conservative for fallback ops)."""
    match line:
        case View(source=source):
            return (source,)
        case KernelCall(fallback=True, fresh=False):
            return tuple(uses(line))
        case KernelCall(fallback=True):
            return ()
        case KernelCall():
            info = info_of(line, registry)
            if info is None or info.view_source is None:
                return ()
            return tuple(refs(arg_value(line, info, info.view_source)))
    return ()


def is_view_call(line: Line, registry: KernelRegistry) -> bool:
    if not isinstance(line, KernelCall) or line.fallback:
        return False
    info = registry.by_name.get(line.kernel)
    return info is not None and info.is_view


def escaping(program: Program, registry: KernelRegistry) -> set[str]:
    """Names whose storage the caller can reach through the returned values."""
    lines = program_lines(program)
    sources = {v.name: alias_sources(line, registry) for line in lines for v in defs(line)}
    todo = [n for line in program.body if isinstance(line, Return) for n in uses(line)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(sources.get(name, ()))
    return seen


@dataclass
class Groups:
    """Union-find over value names: values in one group share storage."""

    parent: dict[str, str] = field(default_factory=dict)
    _by_root: dict[str, list[str]] | None = field(default=None, repr=False, compare=False)  # members, until a change

    def find(self, name: str) -> str:
        if name not in self.parent:
            self.parent[name] = name
            self._by_root = None
            return name
        root = self.parent[name]
        while root != self.parent[root]:
            root = self.parent[root]
        self.parent[name] = root
        return root

    def union(self, a: str, b: str) -> str:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self._by_root = None
        return ra

    def members(self, name: str) -> list[str]:
        """The names in `name`'s group, in the order they were first seen (one pass over all names per change)."""
        root = self.find(name)  # first: a name seen here for the first time is a group of its own
        if self._by_root is None:
            by_root: dict[str, list[str]] = {}
            for n in list(self.parent):
                by_root.setdefault(self.find(n), []).append(n)
            self._by_root = by_root
        return list(self._by_root[root])


def alias_groups(lines: Iterable[Line], registry: KernelRegistry) -> Groups:
    groups = Groups()
    for line in lines:
        for value in defs(line):
            groups.find(value.name)
            for source in alias_sources(line, registry):
                groups.union(source, value.name)
    return groups


def body_written(program: Program, registry: KernelRegistry) -> set[str]:
    """Every name sharing storage with a value some line of the body (or the size memo) writes."""
    groups = alias_groups(program_lines(program), registry)
    writers = (*program.memo, *program.body)
    roots = {groups.find(n) for line in writers if isinstance(line, KernelCall) for n in line.mutates}
    return {n for n in list(groups.parent) if groups.find(n) in roots}


def written_names(program: Program, registry: KernelRegistry) -> set[str]:
    """Inputs and constants whose storage the body writes, directly or through a view."""
    written = body_written(program, registry)
    return {n for n in [i.name for i in program.inputs] + [c.name for c in program.constants] if n in written}


def fresh_namer(program: Program, prefix: str) -> Iterator[str]:
    """Names `prefix0`, `prefix1`, ... not used anywhere in the program (values and generated kernels' locals)."""
    taken = {i.name for i in program.inputs} | {c.name for c in program.constants} | {f.local for f in program.fused}
    for line in program_lines(program):
        taken.update(v.name for v in defs(line))
        taken.update(uses(line))
    n = 0
    while True:
        if f"{prefix}{n}" not in taken:
            yield f"{prefix}{n}"
        n += 1


def ref_names(args: Iterable[Arg]) -> list[str]:
    return [a.name for a in args if isinstance(a, Ref)]


# View ops whose result reads its first argument's elements in their order (a reshape of them).
RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.alias.default")


def view_roots(lines: Sequence[Line], targets: Iterable[str] = RESHAPES) -> dict[str, str]:
    """Value -> the value it views, followed to the end, for `View` lines and calls of the view ops
    `targets` (their first argument is what they view). Unlike `alias_groups`, which says what may
    share storage, two values with one root and one layout read the same elements."""
    views = set(targets)
    roots: dict[str, str] = {}
    for line in lines:
        source = None
        if isinstance(line, View):
            source = line.source
        elif isinstance(line, KernelCall) and line.target in views and line.args and isinstance(line.args[0], Ref):
            source = line.args[0].name
        if source is not None:
            for value in defs(line):
                roots[value.name] = roots.get(source, source)
    return roots
