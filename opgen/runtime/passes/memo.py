"""Size memo: per-call work that depends on nothing but the size symbols runs once per distinct sizes.

With dynamic shapes, views of persistent buffers (`as_strided(slot0, (4, s27, s27), ...)`), views
of constants (a causal mask `mask[:s27, :s27]`) and calls on constants alone (`~mask[:s27, :s27]`)
cannot move to setup as they do with static shapes (`constants`, `hoist_views`): their sizes are
known per call. For the same sizes they give the same result, though, so this pass moves them from
the body to `program.memo`. The backend runs the memo lines at the top of the call only when the
size symbols they read differ from the previous call's, and keeps their results between calls; one
entry, the last sizes' (a server alternating between lengths recomputes on each change, which costs
what the body did before, plus one comparison). A line joins the memo when

- it is a view (a `View` of a slot, or a view kernel) of values that persist between calls
  (constants, buffers, setup values, values of the memo itself). A view aliases its source: what
  the body writes into a slot, or into a buffer the graph mutates, is seen through it;
- or it is a call on the CPU (a CUDA result computed on one call's stream would be read
  unsynchronised by a later call on another), not random, not a torch-op fallback or JIT kernel,
  whose arguments are sizes and values whose contents no call changes (non-mutable constants and
  what setup or the memo computes from them alone, less anything sharing storage with a value the
  body writes), and whose result nothing else writes: a fresh result, or an `out=` buffer (a memo
  view of a slot) that no other line writes;

and none of its values reaches the caller (graph outputs stay fresh tensors).

The pass runs twice: before memory planning, so that calls on constants keep fresh results the
planner does not put in shared buffers (nor write in place: memo values are not the body's to
reuse), and after it, for the views of the buffers it sized for the ranges' upper bounds.
Programs without size symbols are returned unchanged. The values of the memo persist in the
compiled function (closure variables), so the backend runs the memo and the body under the
function's lock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from opgen.runtime.ir import (
    KernelCall,
    Line,
    Program,
    TensorMeta,
    View,
    defs,
    meta_table,
    program_lines,
    symbol_names,
    uses,
)
from opgen.runtime.passes.analysis import (
    Groups,
    alias_groups,
    alias_sources,
    body_written,
    constant_names,
    escaping,
    is_view_call,
    setup_names,
)
from opgen.runtime.registry import KernelRegistry


@dataclass
class _Memo:
    program: Program
    registry: KernelRegistry
    symbols: set[str] = field(init=False)
    resident: set[str] = field(init=False)  # values that persist between calls
    stable: set[str] = field(init=False)  # ... and whose contents no call changes
    escapes: set[str] = field(init=False)
    metas: dict[str, TensorMeta] = field(init=False)
    groups: Groups = field(init=False)
    writers: Counter[str] = field(init=False)  # alias-group root -> lines (body and memo) writing it

    def __post_init__(self) -> None:
        p = self.program
        self.symbols = symbol_names(p)
        self.resident = setup_names(p)
        self.stable = constant_names(p) - body_written(p, self.registry)
        self.escapes = escaping(p, self.registry)
        self.metas = meta_table(p)
        self.groups = alias_groups(program_lines(p), self.registry)
        self.writers = Counter(
            root
            for line in (*p.memo, *p.body)
            if isinstance(line, KernelCall)
            for root in {self.groups.find(m) for m in line.mutates}
        )
        for line in p.memo:  # an earlier run's memo
            self.taken(line)

    def taken(self, line: Line) -> None:
        names = {v.name for v in defs(line)}
        self.resident |= names
        if self.stays_stable(line):
            self.stable |= names | set(getattr(line, "mutates", ()))

    def is_view(self, line: Line) -> bool:
        if not (isinstance(line, View) or is_view_call(line, self.registry)):
            return False
        return not getattr(line, "mutates", ()) and set(uses(line)) <= self.resident | self.symbols

    def is_constant_call(self, line: Line, memo: set[str]) -> bool:
        if not isinstance(line, KernelCall) or line.fallback or line.jit or line.seeded:
            return False
        written = set(line.mutates)
        if not all(self.on_cpu(n) for n in written | {v.name for v in defs(line)}):
            return False
        if not set(uses(line)) - written <= self.stable | self.symbols:
            return False
        fresh_ok = all(self.writers[self.groups.find(v.name)] == 0 for v in defs(line))
        out_ok = all(m in memo and self.writers[self.groups.find(m)] == 1 for m in written)
        return fresh_ok and out_ok and bool(defs(line) or written)

    def on_cpu(self, name: str) -> bool:
        """CUDA results stay per call: a later call on another stream would read them unsynchronised."""
        meta = self.metas.get(name)
        return meta is not None and meta.device == "cpu"

    def stays_stable(self, line: Line) -> bool:
        """A memoised view is stable if its sources are; a memoised call's results always are."""
        if isinstance(line, KernelCall) and not is_view_call(line, self.registry):
            return True
        return set(alias_sources(line, self.registry)) <= self.stable

    def run(self) -> Program:
        if not self.symbols:
            return self.program
        memo: list[Line] = list(self.program.memo)
        body: list[Line] = []
        defined = {v.name for line in memo for v in defs(line)}
        for line in self.program.body:
            names = {v.name for v in defs(line)}
            if names & self.escapes or not (self.is_view(line) or self.is_constant_call(line, defined)):
                body.append(line)
                continue
            memo.append(line)
            defined |= names
            self.taken(line)
        return replace(self.program, memo=tuple(memo), body=tuple(body))


def memoize_sizes(program: Program, registry: KernelRegistry) -> Program:
    return _Memo(program, registry).run()
