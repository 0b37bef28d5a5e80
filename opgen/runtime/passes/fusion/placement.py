"""Group outputs stored where a chain of data movements puts them, so that the movements never run.

Swin's window attention moves data between each layer norm and matrix product:

    y = layer_norm(x + h)                          # a row kernel
    z = roll(y, (-3, -3), (1, 2))                  # shifted windows: a copy
    w = permute(view(z, (B, 8, 7, 8, 7, C)), ...)  # the window partition
    p = clone(w)                                   # a copy, read by the qkv product

and back after the attention (`view -> permute -> clone -> roll -> residual add`). Each `roll` and
`clone` is a kernel that reads and writes the whole tensor. Where the group's value `y` is read by such
a chain (each value in it read only by the next link, ending at a copy: `clone` or `roll`), the fused
kernel stores `y` at the copy's addresses instead: an element's coordinates in `y`'s shape are carried
through the moves (a reshape re-reads the row-major index, a permute reorders coordinates, a roll adds
its shift modulo the size) and the store's address is the last coordinates times the copy's strides.
`y` itself is written only where something else reads it (the output's `Placement`; the address is
written by `opgen.runtime.codegen.triton.placement`). This is Inductor's indexing for the same graph
(its kernel for Swin's `roll` + partition + layer norm stores through one index expression).

Links: reshapes (`view`, `_unsafe_view`, `reshape`, `alias`), `permute`, `roll`, `clone`; static
sizes, one dtype. The chain's lines join the group's members (its ATen side runs them, so both sides
of the kernel choice compute the same values); the kernel stays where the group was, since the
chain reads nothing else, and no member reads the chain (a group takes no member after a line
outside it has read its values). A value of `y` read besides the chain must not be a view or a write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Move, Placement, Program, Ref, Tensor, TensorMeta, meta_table
from opgen.runtime.ir.fusible import PERMUTE
from opgen.runtime.passes.analysis import RESHAPES, arg_value, is_view_call, readers, writes_memory
from opgen.runtime.passes.fusion.groups import Found
from opgen.runtime.registry import KernelRegistry

CLONE, ROLL = "aten.clone.default", "aten.roll.default"
COPIES = frozenset({CLONE, ROLL})  # links that write a fresh tensor: a chain ends at one


def place_outputs(found: Sequence[Found], program: Program, registry: KernelRegistry) -> list[Found]:
    """The groups worth a kernel, with their outputs carried through the chains of data movement that
    read them. A group of one node (`alone`) is worth one once a chain joins it (a lone layer norm
    and its window partition), or where it reads a strided input (`strided`), and dropped where
    another group's chain takes its node (a `clone`)."""
    chains = _Chains(program, registry, {m for f in found if not f.alone for m in f.members})
    kept = []
    for item in sorted(found, key=lambda f: f.members[0]):
        if item.alone and chains.taken.intersection(item.members):
            continue
        extended = chains.extend(item)
        if not item.alone or item.strided or extended is not item:
            chains.taken.update(extended.members)
            kept.append(extended)
    return kept


class _Chains:
    def __init__(self, program: Program, registry: KernelRegistry, taken: set[int]) -> None:
        self.body, self.registry, self.taken = program.body, registry, taken
        self.metas, self.read_by = meta_table(program), readers(program.body)

    def extend(self, found: Found) -> Found:
        group, members = found.group, set(found.members)
        outputs: list[Tensor] = []
        links: list[int] = []
        moved: list[str] = []
        for out in group.outputs:
            chain = self._chain(out, members) if out.meta.shape == group.shape else None
            if chain is None:
                outputs.append(out)
                continue
            at, moves, last = chain
            self.taken.update(at)
            links += at
            moved += [self._call(i).node for i in at]
            if self._read_besides(out.name, members | set(at)):
                outputs.append(out)
            outputs.append(Tensor(last, self.metas[last], Placement(out.name, moves)))
        if not links:
            return found
        order = sorted([*zip(found.members, found.lines, strict=True), *((i, self._call(i)) for i in links)])
        return Found(
            replace(group, outputs=tuple(outputs), moved=(*group.moved, *moved)),
            tuple(i for i, _ in order),
            tuple(line for _, line in order),
        )

    def _chain(self, out: Tensor, members: set[int]) -> tuple[list[int], tuple[Move, ...], str] | None:
        """(the links' body indices, their moves, the value the last copy makes) of the longest chain
        from `out` that ends at a copy, or None."""
        outside = [self.body[i] for i in self.read_by.get(out.name, set()) - members]
        links = [line for line in outside if self._link(line, out.meta) is not None]
        if len(links) != 1 or any(line is not links[0] and (writes_memory(line) or is_view_call(line, self.registry))
                                  for line in outside):  # fmt: skip
            return None
        at: list[int] = []
        moves: list[Move] = []
        best = None
        name, meta = out.name, out.meta
        while True:
            readers_ = self.read_by.get(name, set()) - members
            if at and len(readers_) != 1:
                break
            found = ((i, step) for i in sorted(readers_) if (step := self._link(self.body[i], meta)) is not None)
            index, step = next(found, (None, None))
            if index is None or step is None or index in self.taken:
                break
            line = self._call(index)
            assert line.outputs[0] is not None and line.outputs[0].meta is not None
            at.append(index)
            moves += step
            name, meta = line.outputs[0].name, line.outputs[0].meta
            if line.target in COPIES:
                best = (list(at), tuple(moves), name)
        return best

    def _read_besides(self, name: str, lines: set[int]) -> bool:
        return bool(self.read_by.get(name, set()) - lines)

    def _call(self, index: int) -> KernelCall:
        line = self.body[index]
        assert isinstance(line, KernelCall)
        return line

    def _link(self, line: Line, source: TensorMeta) -> list[Move] | None:
        """The moves of a link reading `source` (as its first argument), or None where it is not one."""
        if not isinstance(line, KernelCall) or line.fallback or line.mutates or len(line.outputs) != 1:
            return None
        out = line.outputs[0]
        if out is None or out.meta is None or not out.meta.is_static or out.meta.dtype != source.dtype:
            return None
        if out.meta.device != source.device or not line.args or not isinstance(line.args[0], Ref):
            return None
        shape = tuple(int(n) for n in source.shape)  # type: ignore[arg-type]
        if line.target in RESHAPES:
            return [("reshape", tuple(out.meta.shape), ())] if out.meta.shape != source.shape else []  # type: ignore[arg-type]
        if line.target == CLONE:
            return []
        info = self.registry.by_name.get(line.kernel)
        if info is None:
            return None
        if line.target == PERMUTE:
            given = arg_value(line, info, "dims")
            dims = tuple(d % len(shape) for d in given if isinstance(d, int)) if isinstance(given, tuple) else ()
            return [("permute", dims, ())] if sorted(dims) == list(range(len(shape))) else None
        if line.target == ROLL:
            return _roll(arg_value(line, info, "shifts"), arg_value(line, info, "dims"), shape)
        return None


def _roll(shifts: object, dims: object, shape: tuple[int, ...]) -> list[Move] | None:
    shifts = shifts if isinstance(shifts, tuple) else (shifts,)
    dims = dims if isinstance(dims, tuple) else (dims,) if dims is not None else ()
    if not all(type(s) is int for s in shifts) or not all(type(d) is int for d in dims):
        return None
    if not dims:  # over the flattened tensor
        if len(shifts) != 1:
            return None
        total = math.prod(shape)
        return [("reshape", (total,), ()), ("roll", (shifts[0] % max(total, 1),), (0,)), ("reshape", shape, ())]
    if len(shifts) != len(dims) or not all(-len(shape) <= d < len(shape) for d in dims):
        return None
    dims = tuple(d % len(shape) for d in dims)
    return [("roll", tuple(s % shape[d] for s, d in zip(shifts, dims, strict=True)), dims)]
