"""A row group computed a block of columns at a time, for a kernel that walks its rows in blocks: the
few-row product kernel that computes its input rows first (`codegen.triton.few_rows_prologue`).

A row group's own kernel holds each row whole (`codegen.triton.groups`). A few-row product kernel walks K
in blocks for all its rows at once, and its rows whole would not fit in registers beside its tiles. So
the group is split at its reductions (which `passes.fusion.gemv_prologue.blockwise` admits: sums, means,
maxima and minima over the row that no other reduction feeds, an RMSNorm's mean of squares):

- `_sums` walks the rows once, a block of columns at a time, and combines each reduction's parts (a
  mean's parts are sums divided by the row's length); it returns them, one value per row.
- `_loads` reads what the group reads at one block of columns, and `_block` computes the group there from
  those values, each reduction read from the sums: it returns the output the products read, as stored and
  zero outside the rows, and stores the group's other outputs where STORE holds (one program of the
  calling kernel). Apart, a caller can read the next block before it computes this one: a block computed
  where it is loaded left each step of K waiting for its reads from cache (Llama-3.2-1B's batch-8 step
  took 70 us longer on an H200, its q/k/v and gate/up kernels 3.3 and 3.5 us each).

The steps are the group's own kernel's (`groups.GroupBody`), so both compute the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opgen.runtime.codegen.triton.groups import ROW_STEPS, GroupBody, group_params
from opgen.runtime.codegen.triton.ops import Operand
from opgen.runtime.ir import FusedGroup, Step, flat_steps, refs
from opgen.runtime.ir.fusible import BLOCKWISE, compute_type

# Per reduction: the identity its parts start from, and how two parts combine.
_START = {"aten.sum.dim_IntList": "0.0", "aten.mean.dim": "0.0", "aten.amax.default": 'float("-inf")',
          "aten.amin.default": 'float("inf")'}  # fmt: skip
_COMBINE = {"aten.sum.dim_IntList": "{} + {}", "aten.mean.dim": "{} + {}", "aten.amax.default": "tl.maximum({}, {})",
            "aten.amin.default": "tl.minimum({}, {})"}  # fmt: skip


@dataclass
class _Blocks(GroupBody):
    """A group's steps at one block of columns. Each reduction's value is the name in `totals`; with
    `parts`, the reduction's part over this block is combined into it first."""

    totals: dict[str, str] = field(default_factory=dict)
    parts: bool = False

    def step(self, step: Step) -> None:
        if step.target not in BLOCKWISE:
            return super().step(step)
        out = next(t for t in step.outputs if t is not None)
        total = self.totals[out.name]
        if self.parts:
            (part,) = ROW_STEPS[step.target](self, self.arguments(step), step)
            self.lines.append(f"{total} = {_COMBINE[step.target].format(total, part.text)}")
        self.values[out.name] = Operand(total, compute_type(out.meta.dtype))
        return None


def _reductions(group: FusedGroup) -> list[Step]:
    return [s for s in flat_steps(group.steps) if s.target in BLOCKWISE]


def _reads(step: Step) -> tuple[str, ...]:
    return tuple(refs(tuple(v for _, v in step.values)))


def _needed(group: FusedGroup) -> list[Step]:
    """The steps the reductions read, and the reductions: what `_sums` computes."""
    steps = flat_steps(group.steps)
    wanted = {name for s in _reductions(group) for name in _reads(s)}
    keep: list[Step] = []
    for step in reversed(steps):
        if step.target in BLOCKWISE or wanted & {t.name for t in step.outputs if t is not None}:
            keep.insert(0, step)
            wanted |= set(_reads(step))
    return keep


def _elements(group: FusedGroup) -> list[str]:
    """The block's elements: every row (BLOCK_M of them, at least the group's), columns `start` on."""
    rows = 1
    for n in group.shape[:-1]:
        rows *= n
    return ["rows = tl.arange(0, BLOCK_M)[:, None]", "cols = start + tl.arange(0, BLOCK_K)[None, :]",
            f"rmask = rows < {rows}", f"cmask = cols < {group.shape[-1]}", "mask = rmask & cmask"]  # fmt: skip


def _sums(group: FusedGroup, totals: dict[str, str]) -> str:
    body = _Blocks(group, totals=totals, parts=True)
    for step in _needed(group):
        body.step(step)
    names = list(totals.values())
    starts = [f"{totals[s.outputs[0].name]} = tl.full((BLOCK_M, 1), {_START[s.target]}, tl.float32)"  # type: ignore[union-attr]
              for s in _reductions(group)]  # fmt: skip
    return "\n".join([
        "@triton.jit",
        f"def _sums({', '.join(p for p in group_params(group) if p.startswith('in'))}, BLOCK_M: tl.constexpr,"
        " BLOCK_K: tl.constexpr):",
        f'    """{group.describe()}: its reductions over each row, a block of BLOCK_K columns at a time."""',
        *(f"    {line}" for line in starts),
        f"    for start in range(0, {group.shape[-1]}, BLOCK_K):",
        *(f"        {line}" for line in (*_elements(group), *body.lines)),
        f"    return {', '.join(names)}",
    ])  # fmt: skip


def _loaded(group: FusedGroup, totals: dict[str, str]) -> list[str]:
    """The inputs the block's steps read (the reductions' values given)."""
    body = _Blocks(group, totals=totals)
    for step in flat_steps(group.steps):
        body.step(step)
    return [t.name for t in group.inputs if t.name in body.values]


def _loads(group: FusedGroup, loaded: list[str]) -> str:
    body = _Blocks(group)
    values = [body.operand(name).text for name in loaded]
    return "\n".join([
        "@triton.jit",
        f"def _loads({', '.join(p for p in group_params(group) if p.startswith('in'))}, start, BLOCK_M: tl.constexpr,"
        " BLOCK_K: tl.constexpr):",
        f'    """{group.describe()}: what its block at columns start..start + BLOCK_K reads."""',
        *(f"    {line}" for line in (*_elements(group), *body.lines)),
        f"    return {', '.join(values)}",
    ])  # fmt: skip


def _block(group: FusedGroup, totals: dict[str, str], loaded: list[str], returned: int,
           store_returned: bool) -> tuple[str, list[str]]:  # fmt: skip
    body = _Blocks(group, totals=totals)
    for i, name in enumerate(loaded):
        body.values[name] = Operand(f"l{i}", compute_type(body.tensors[name].meta.dtype))
    for step in flat_steps(group.steps):
        body.step(step)
    computed = len(body.lines)
    for i, out in enumerate(group.outputs):
        if i != returned or store_returned:
            body.store(out)
    stores = body.lines[computed:]
    params = [p for i, p in enumerate(group_params(group)) if i != len(group.inputs) + returned or store_returned]
    outputs = [p for p in params if p.startswith("out")]
    lines = [
        "@triton.jit",
        f"def _block({', '.join([*(f'l{i}' for i in range(len(loaded))), *outputs, *totals.values()])}, start, STORE,"
        " BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):",
        f'    """{group.describe()} at columns start..start + BLOCK_K from what `_loads` read there: the rows the'
        ' products read, zero past the rows; the other outputs stored where STORE holds."""',
        *(f"    {line}" for line in (*_elements(group), *body.lines[:computed])),
        *(["    if STORE:", *(f"        {line}" for line in stores)] if stores else []),
        f"    xs = {body.stored(group.outputs[returned])}",
        "    return tl.where(mask, xs, tl.zeros_like(xs))",
    ]
    return "\n".join(lines), params


def block_prologue(group: FusedGroup, returned: int,
                   store_returned: bool = False) -> tuple[str, list[str], list[str], int]:  # fmt: skip
    """(source, tensor parameters, reduction names, loads) of three functions:
    - `_sums(<inputs>, BLOCK_M, BLOCK_K)` returns the group's reductions (named as the third item);
    - `_loads(<inputs>, start, BLOCK_M, BLOCK_K)` returns what the group reads at columns start..start +
      BLOCK_K (`loads` values, `l0..`), so that a caller can read the next block before it computes this one;
    - `_block(l0.., <outputs>, <reductions>, start, STORE, BLOCK_M, BLOCK_K)` returns output `returned` at
      those columns of every row as stored (in its dtype), and stores the others (that one too with
      `store_returned`) where STORE holds.
    Parameters: `in0..` for the inputs, `out<i>` for each output stored (numbered as in the group's own
    kernel)."""
    assert group.kind == "row", group.describe()
    totals = {s.outputs[0].name: f"s{i}" for i, s in enumerate(_reductions(group))}  # type: ignore[union-attr]
    loaded = _loaded(group, totals)
    block, params = _block(group, totals, loaded, returned, store_returned)
    source = f"{_sums(group, totals)}\n\n\n{_loads(group, loaded)}\n\n\n{block}\n"
    return source, params, list(totals.values()), len(loaded)
