"""Which nodes of a program fuse: maximal groups of pointwise nodes, and row reductions joining them.

One walk over the body, in order. A fusible node (`opgen.runtime.passes.fusion.steps`: a functional CUDA
call with static sizes) joins the open group that defines one of its operands when the shapes fit,
else it starts a group. A group runs where its last member was, so it closes (takes no more
members) when anything outside it reads one of its values, and every group closes at a call that
writes memory (in-place and out= calls, ATen fallbacks, Triton kernels): moving a read across a
write could change what it reads. Nothing is fused across such a call, a matmul or a convolution,
since those are never members.

Shapes: a pointwise group iterates over one shape `S` (its members' output shape; operands
broadcast to it). A row group also holds reductions over the last dimension of `S`: its values
are full (`S`) or reduced (`S[:-1] + (1,)`, broadcast back along the row); a reduction without
keepdim is an output only. Each group is a `FusedGroup` (`opgen.runtime.ir.plans`): the plan of its
kernel, which `opgen.runtime.codegen.triton.groups` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from opgen.runtime.ir import (
    FusedGroup,
    KernelCall,
    Line,
    Program,
    Ref,
    Return,
    Step,
    Tensor,
    TensorMeta,
    flat_steps,
    meta_table,
    refs,
    uses,
)
from opgen.runtime.ir.fusible import CAT, ROW_OPS
from opgen.runtime.passes.analysis import alias_groups, readers, writes_memory
from opgen.runtime.passes.fusion.steps import device_of, out_shape, reduced_input, step_of
from opgen.runtime.registry import KernelRegistry

# Row reductions whose ATen kernel copies a strided input to a contiguous one before it runs.
COPYING_ROWS = frozenset({"aten.native_layer_norm.default", "aten._softmax.default", "aten._log_softmax.default"})
COPIES = frozenset({"aten.clone.default"})
RUNTIME_LAYOUT = frozenset({"aten.scaled_dot_product_attention.default"})  # see `runtime_layout`


def runtime_layout(program: Program, registry: KernelRegistry) -> set[str]:
    """Values (and their views) whose strides ATen picks when it runs, not the ones the graph recorded.

    A generated kernel indexes its operands by their recorded strides, so it never reads these: their
    readers stay ATen calls, which take any strides. Attention is such an op: ATen chooses flash,
    memory-efficient, cuDNN or math attention by the inputs and the device, and the fused kernels return
    [B, L, H, D] storage seen as [B, H, L, D] where the graph (traced through the math path) recorded it
    contiguous. A kernel copying `attention.transpose(1, 2)` then read the wrong elements (ViT, DeiT
    and BART in float32 on an H200, up to 3.4 off eager).
    """
    groups = alias_groups(program.body, registry)
    roots = {
        groups.find(value.name)
        for line in program.body
        if isinstance(line, KernelCall) and line.target in RUNTIME_LAYOUT
        for value in line.outputs
        if value is not None
    }
    return {name for name in list(groups.parent) if groups.find(name) in roots} if roots else set()


@dataclass(frozen=True, slots=True)
class Found:
    """A group and where it was: the body indices of its members (it runs at the last)."""

    group: FusedGroup
    members: tuple[int, ...]
    lines: tuple[KernelCall, ...]
    alone: bool = False  # one node, which ATen runs as well (found only when asked for: `singles`)
    strided: bool = False  # alone, yet worth a kernel of its own: it reads a strided input (`_strided_alone`)


def find_groups(program: Program, registry: KernelRegistry, singles: bool = False) -> list[Found]:
    metas = meta_table(program)
    read_later = readers(program.body)
    unknown = runtime_layout(program, registry)
    walk = _Walk(metas, read_later)
    for index, line in enumerate(program.body):
        fusible = isinstance(line, KernelCall) and not unknown.intersection(uses(line))
        step = step_of(line, registry, metas) if fusible else None
        if step is None:
            walk.outside(line)
        else:
            assert isinstance(line, KernelCall)
            walk.add(index, line, step)
    walk.close_all()
    return [found for b in walk.done if (found := b.finish(read_later, singles)) is not None]


@dataclass
class _Building:
    kind: str
    shape: tuple[int, ...]
    device: str
    members: list[int] = field(default_factory=list)
    lines: list[KernelCall] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    step_at: list[int] = field(default_factory=list)  # each step's body index (a cat's absorbed members have none)
    defined: dict[str, Tensor] = field(default_factory=dict)
    inputs: dict[str, Tensor] = field(default_factory=dict)
    open: bool = True

    @property
    def has_cat(self) -> bool:
        return any(s.target == CAT for s in self.steps)

    def fits(self, step: Step, metas: dict[str, TensorMeta]) -> bool:
        if device_of(step) != self.device or step.target == CAT:
            return False  # a cat starts its own group (its operands are read at shifted indices)
        if step.target in ROW_OPS and self.has_cat:
            return False  # a row kernel indexes by rows and columns, which a cat's ranges do not use
        reduced = (*self.shape[:-1], 1)
        for _, value in step.values:  # values of the group it reads must be full rows or reduced ones
            if isinstance(value, Ref) and value.name in self.defined:
                if self.defined[value.name].meta.shape not in (self.shape, reduced):
                    return False
        if step.target in ROW_OPS:
            return reduced_input(step, metas).shape == self.shape
        shape = out_shape(step)
        return shape == self.shape or (self.kind == "row" and shape == reduced)

    def take(self, index: int, line: KernelCall, step: Step) -> None:
        if step.target in ROW_OPS:
            self.kind = "row"
        self.members.append(index)
        self.lines.append(line)
        self.steps.append(step)
        self.step_at.append(index)
        self.defined.update((t.name, t) for t in step.outputs if t is not None)

    def _strided_alone(self) -> bool:
        """A lone node worth a generated kernel, as it reads a strided input (a permuted tensor):
        - a row reduction (a layer norm of a permuted tensor, as ConvNeXt's): ATen's kernel copies its
          input to a contiguous one first, the generated one reads it in place;
        - a copy of a permuted tensor (Swin's queries, keys and values before their batched products):
          ATen's copy kernel took 2.6 us a copy on the H100, Inductor's generated ones 1.4 us. Not a
          copy of a broadcast (stride 0, a grouped-query attention's repeated heads): ATen's is as fast."""
        if len(self.steps) != 1 or self.steps[0].target not in COPYING_ROWS | COPIES:
            return False
        strided = [t.meta for t in self.inputs.values() if not t.meta.is_contiguous()]
        if self.steps[0].target in COPIES:
            strided = [m for m in strided if all(st or n == 1 for n, st in zip(m.shape, m.stride, strict=True))]
        return bool(strided)

    def mergeable(self, other: _Building) -> bool:
        """`other` (open, of one shape with this group) can join it: neither read the other's values,
        or the operand's group would have closed."""
        if other.device != self.device or other.shape != self.shape:
            return False
        row = "row" in (self.kind, other.kind)
        return not (row and (self.has_cat or other.has_cat))

    def merge(self, other: _Building) -> None:
        """Take every member of `other`; members stay in body order, so steps stay in dependency order."""
        if other.kind == "row":
            self.kind = "row"
        lines = sorted(zip(self.members + other.members, self.lines + other.lines, strict=True), key=_first)
        steps = sorted(zip(self.step_at + other.step_at, self.steps + other.steps, strict=True), key=_first)
        self.members, self.lines = [m for m, _ in lines], [line for _, line in lines]
        self.step_at, self.steps = [i for i, _ in steps], [step for _, step in steps]
        self.defined.update(other.defined)
        self.inputs.update(other.inputs)

    def finish(self, read_later: dict[str, set[int]], singles: bool) -> Found | None:
        alone = len(flat_steps(tuple(self.steps))) < 2
        strided = alone and self._strided_alone()
        if alone and not strided and not singles:
            return None  # one node gains nothing: ATen's own kernel runs it
        members = set(self.members)
        outputs = tuple(t for name, t in self.defined.items() if read_later.get(name, set()) - members)
        if not outputs:
            return None
        group = FusedGroup(self.kind, self.shape, tuple(self.inputs.values()), outputs, tuple(self.steps))
        return Found(group, tuple(self.members), tuple(self.lines), alone, strided)


class _Walk:
    def __init__(self, metas: dict[str, TensorMeta], read_later: dict[str, set[int]]) -> None:
        self.metas = metas
        self.read_later = read_later
        self.owner: dict[str, _Building] = {}
        self.open: list[_Building] = []
        self.done: list[_Building] = []

    def outside(self, line: Line) -> None:
        """A line that stays: it closes the groups it reads from, or all of them if it writes memory."""
        if writes_memory(line) or isinstance(line, Return):
            self.close_all()
        for name in uses(line):
            self._close(self.owner.get(name))

    def add(self, index: int, line: KernelCall, step: Step) -> None:
        if step.target == CAT:
            self._cat(index, line, step)
            return
        operands = list(refs(tuple(v for _, v in step.values)))
        joined = next(
            (g for n in operands if (g := self.owner.get(n)) is not None and g.open and g.fits(step, self.metas)),
            None,
        )
        absorbed = []
        for name in operands:
            group = self.owner.get(name)
            if group is None or group is joined or not group.open:
                continue
            if joined is not None and joined.mergeable(group):
                self._merge(joined, group)
            elif self._broadcast_into(group, step, index):
                absorbed.append(group)
            else:
                self._close(group)
        if joined is None:
            joined = self._start(step)
            if joined is None:
                for group in absorbed:
                    self._close(group)
                return
        for group in absorbed:
            if group.open:  # once, where two operands come from one group
                self._merge(joined, group)
        for name in operands:
            if name not in joined.defined:
                joined.inputs.setdefault(name, Tensor(name, self.metas[name]))
        self._take(joined, index, line, step)

    def _broadcast_into(self, group: _Building, step: Step, index: int) -> bool:
        """A pointwise group of a smaller shape that broadcasts to the pointwise step's, whose values only
        that step reads (a squeeze-excitation's `sigmoid(s)` of [N, C, 1, 1] scaling `x` of [N, C, H, W]):
        it runs inside the step's kernel, recomputed at each element it broadcasts to, never stored."""
        if step.target in ROW_OPS or group.kind != "pointwise" or group.has_cat or group.device != device_of(step):
            return False
        shape = out_shape(step)
        if group.shape == shape or not _broadcasts(group.shape, shape):
            return False
        return self._read_only_by(group, index)

    def _read_only_by(self, group: _Building, index: int) -> bool:
        """Nothing but the group's own members and the line at `index` reads the group's values."""
        allowed = {*group.members, index}
        return all(self.read_later.get(name, set()) <= allowed for name in group.defined)

    def _take(self, group: _Building, index: int, line: KernelCall, step: Step) -> None:
        group.take(index, line, step)
        for t in step.outputs:
            if t is not None:
                self.owner[t.name] = group

    def _merge(self, into: _Building, other: _Building) -> None:
        into.merge(other)
        other.open = False
        self.open.remove(other)
        for name in other.defined:
            self.owner[name] = into

    def _cat(self, index: int, line: KernelCall, step: Step) -> None:
        """Start the cat's group, absorbing each open group that computes one of its operands and whose
        values nothing else reads; the other groups it reads from close."""
        operands = list(refs(tuple(v for _, v in step.values)))
        absorbed: dict[int, _Building] = {}
        for name in operands:
            group = self.owner.get(name)
            if group is None or not group.open or id(group) in absorbed:
                continue
            if self._absorbable(group, name, index):
                absorbed[id(group)] = group
            else:
                self._close(group)
        branches = tuple(
            tuple(g.steps) if (g := self.owner.get(name)) is not None and id(g) in absorbed else () for name in operands
        )
        joined = self._start(step)
        if joined is None:
            for group in absorbed.values():
                self._close(group)
            return
        for group in absorbed.values():
            group.open = False
            self.open.remove(group)
            joined.members += group.members
            joined.lines += group.lines
            joined.inputs.update(group.inputs)
        order = sorted(range(len(joined.members)), key=joined.members.__getitem__)
        joined.members = [joined.members[i] for i in order]
        joined.lines = [joined.lines[i] for i in order]
        for name, branch in zip(operands, branches, strict=True):
            if not branch:
                joined.inputs.setdefault(name, Tensor(name, self.metas[name]))
        self._take(joined, index, line, replace(step, branches=branches))

    def _absorbable(self, group: _Building, operand: str, cat: int) -> bool:
        """A pointwise group computing the operand in the operand's own shape, whose values only it and
        the cat read (it then runs inside the cat's kernel, once per range that reads it)."""
        if group.kind != "pointwise" or group.shape != self.metas[operand].shape or group.has_cat:
            return False  # a cat inside a cat's range: the inner one is written to memory instead
        return self._read_only_by(group, cat)

    def _start(self, step: Step) -> _Building | None:
        if step.target in ROW_OPS:
            shape = reduced_input(step, self.metas).shape
            kind = "row"
        else:
            shape, kind = out_shape(step), "pointwise"
        if not shape or any(n == 0 for n in shape):
            return None
        group = _Building(kind, shape, device_of(step))  # type: ignore[arg-type]
        self.open.append(group)
        return group

    def _close(self, group: _Building | None) -> None:
        if group is not None and group.open:
            group.open = False
            self.open.remove(group)
            self.done.append(group)

    def close_all(self) -> None:
        for group in list(self.open):
            self._close(group)


def _broadcasts(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """`small` broadcasts to `shape` (right-aligned, each dim equal or 1), with no more dims."""
    if len(small) > len(shape):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(small), reversed(shape), strict=False))


def _first(pair: tuple[int, object]) -> int:
    return pair[0]
