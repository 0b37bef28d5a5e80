"""A fusion group's code as a function that another kernel calls: the printers of kernels that take
groups in (`codegen.triton.gemv_prologue`: a norm computed first; `codegen.triton.horizontal`: several
pointwise or row groups in one launch). The code is the group's own kernel's (`codegen.triton.groups`), its start
(which row, which block) given by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from opgen.runtime.codegen.triton.groups import GroupBody, _address, group_body, group_params, program_elements
from opgen.runtime.codegen.triton.module import next_power_of_2
from opgen.runtime.codegen.triton.ops import TL, Operand, compute_type
from opgen.runtime.codegen.triton.order import in_memory_order
from opgen.runtime.ir import FusedGroup, RowRead, Step
from opgen.runtime.ir.fusible import REDUCTIONS, ROW_OPS


def row_prologue(group: FusedGroup, returned: int, store_returned: bool = False) -> tuple[str, list[str]]:
    """(source, tensor parameters) of `@triton.jit def _prologue(<parameters>, STORE, BLOCK_N)`: a row
    group of one row computed whole in registers, for a kernel that starts with it
    (`codegen.triton.gemv_prologue`). It stores the group's outputs but output `returned` (that one
    too with `store_returned`) where STORE holds (one program of the calling kernel), and returns that
    one as it would be stored, in float32: a [1, BLOCK_N] tensor (BLOCK_N at least the row's length).
    Parameters: `in0..` for the inputs, `out<i>` for each output stored (numbered as in the group's
    own kernel)."""
    assert group.kind == "row" and math.prod(group.shape[:-1]) == 1, group.describe()
    body = group_body(group, stored=())
    computed = len(body.lines)
    for i, out in enumerate(group.outputs):
        if i != returned or store_returned:
            body.store(out)
    stores = [f"    {line}" for line in body.lines[computed:]]
    value = body.stored(group.outputs[returned])
    params = [p for i, p in enumerate(group_params(group))
              if i != len(group.inputs) + returned or store_returned]  # fmt: skip
    one_row = ["rows = tl.arange(0, 1)[:, None]", "cols = tl.arange(0, BLOCK_N)[None, :]", "rmask = rows < 1",
               f"cmask = cols < {group.shape[-1]}", "mask = rmask & cmask"]  # fmt: skip
    lines = [
        "@triton.jit",
        f"def _prologue({', '.join(params)}, STORE, BLOCK_N: tl.constexpr):",
        f'    """{group.describe()}: its one row, whole; the outputs stored where STORE holds."""',
        *(f"    {line}" for line in (*one_row, *body.lines[:computed])),
        *(["    if STORE:", *(f"    {line}" for line in stores)] if stores else []),
        f"    return ({value}).to(tl.float32)",
    ]
    return "\n".join(lines) + "\n", params


def pointwise_part(group: FusedGroup, name: str) -> str:
    """Source of `@triton.jit def <name>(in0.., out0.., pid, BLOCK)`: the pointwise group's kernel as a
    function of its block number, for a kernel that launches several groups at once
    (`codegen.triton.horizontal`). Parameters as the group's own kernel's (`group_params`)."""
    assert group.kind == "pointwise", group.describe()
    group = in_memory_order(group)
    body = group_body(group)
    start = ["offs = pid * BLOCK + tl.arange(0, BLOCK)", f"mask = offs < {math.prod(group.shape)}"]
    lines = [
        "@triton.jit",
        f"def {name}({', '.join(group_params(group))}, pid, BLOCK: tl.constexpr):",
        f'    """{group.describe()}"""',
        *(f"    {line}" for line in (*start, *body.lines)),
    ]
    return "\n".join(lines) + "\n"


def row_part(group: FusedGroup, name: str) -> str:
    """Source of `@triton.jit def <name>(in0.., out0.., pid, BLOCK_R, BLOCK_N)`: the row group's kernel as a
    function of its block of rows, for a kernel that launches several row groups at once
    (`codegen.triton.horizontal`; BLOCK_N at least its row's length). Parameters as the group's own kernel's."""
    assert group.kind == "row", group.describe()
    group = in_memory_order(group)
    body = group_body(group)
    lines = [
        "@triton.jit",
        f"def {name}({', '.join(group_params(group))}, pid, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):",
        f'    """{group.describe()}"""',
        *(f"    {line}" for line in (*program_elements(group, "pid"), *body.lines)),
    ]
    return "\n".join(lines) + "\n"


def pointwise_value(group: FusedGroup, name: str, reads: Sequence[RowRead] = (),
                    rows: Sequence[FusedGroup] = ()) -> str:  # fmt: skip
    """Source of `@triton.jit def <name>(in0.., offs, mask)`: the pointwise group's one output at the
    flat indices `offs` of its iteration space (row-major over its shape; any shape of tensor), as it
    would be stored (in the output's dtype), for a kernel that computes a value where it would load it
    (`codegen.triton.attention_prologue`). Parameters: `in0..` for the group's inputs.

    With `reads`, those inputs are views of the row groups `rows` (a norm), computed too: the parameters are
    `in<i>` for the other inputs, `r<k>_<j>` for row group k's, then `row` (the row groups' row that every
    valid element of a call reads) before `offs, mask`; each row group's reductions are computed once at the
    start (`row_stats`), its value at each element read (`row_value`)."""
    assert group.kind == "pointwise" and len(group.outputs) == 1, group.describe()
    body = _CallingBody(group)
    computed = {read.input for read in reads}
    helpers = []
    for k, row_group in enumerate(rows):
        stats = len(reductions(row_group))
        helpers.append(row_stats(row_group, f"{name}_stats{k}"))
        inputs = ", ".join(f"r{k}_{j}" for j in range(len(row_group.inputs)))
        names = [f"s{k}_{i}" for i in range(stats)]
        body.lines.append(f"{', '.join(names)} = {name}_stats{k}({inputs}, row)")
        for read in (r for r in reads if r.source == k):
            helpers.append(row_value(row_group, read.output, f"{name}_row{k}_{read.output}"))
            call = f"{name}_row{k}_{read.output}({inputs}, {', '.join(names)}, "
            body.calls[group.inputs[read.input].name] = call
    for step in group.steps:
        body.step(step)
    params = [f"in{i}" for i in range(len(group.inputs)) if i not in computed]
    params += [f"r{k}_{j}" for k, g in enumerate(rows) for j in range(len(g.inputs))]
    params += ["row"] if rows else []
    doc = f"{group.describe()}: its output at `offs`."
    value = _returning(f"{name}({', '.join([*params, 'offs', 'mask'])})", doc, body)
    return "\n".join([*dict.fromkeys(helpers), value])


def reductions(group: FusedGroup) -> list[Step]:
    """The row group's reductions over its rows, in order."""
    return [step for step in group.steps if step.target in ROW_OPS]


def row_stats(group: FusedGroup, name: str) -> str:
    """Source of `@triton.jit def <name>(in0.., row)`: the row group's reductions (`REDUCTIONS` alone) over
    its row `row`, whole, one scalar each (float32 or the reduction's type), in order; the steps after the
    last one are left to `row_value`."""
    steps = reductions(group)
    assert group.kind == "row" and steps and all(s.target in REDUCTIONS for s in steps), group.describe()
    body = GroupBody(group)
    for step in group.steps[: group.steps.index(steps[-1]) + 1]:
        body.step(step)
    block = next_power_of_2(group.shape[-1])
    one_row = ["rows = row + tl.arange(0, 1)[:, None]", f"cols = tl.arange(0, {block})[None, :]",
               f"rmask = rows < {math.prod(group.shape[:-1])}", f"cmask = cols < {group.shape[-1]}",
               "mask = rmask & cmask"]  # fmt: skip
    values = [body.values[next(t for t in s.outputs if t is not None).name].text for s in steps]
    lines = [
        "@triton.jit",
        f"def {name}({', '.join([*(f'in{i}' for i in range(len(group.inputs))), 'row'])}):",
        f'    """{group.describe()}: its reductions over row `row`."""',
        *(f"    {line}" for line in (*one_row, *body.lines)),
        f"    return {', '.join(f'tl.sum({v}, axis=None)' for v in values)}",
    ]
    return "\n".join(lines) + "\n"


def row_value(group: FusedGroup, output: int, name: str) -> str:
    """Source of `@triton.jit def <name>(in0.., s0.., idx, imask)`: the row group's output `output` at the
    flat indices `idx` of its iteration space, as stored, its reductions the scalars `s0..` (`row_stats`'):
    the steps computed at each element, those reductions' results given."""
    body = GroupBody(replace(group, kind="pointwise"))
    body.space = replace(body.space, index="idx", mask="imask")
    stats = [f"s{i}" for i in range(len(reductions(group)))]
    for step, stat in zip(reductions(group), stats, strict=True):
        out = next(t for t in step.outputs if t is not None)
        body.values[out.name] = Operand(stat, compute_type(out.meta.dtype))
    for step in group.steps:
        if step.target not in ROW_OPS:
            body.step(step)
    params = [*(f"in{i}" for i in range(len(group.inputs))), *stats, "idx", "imask"]
    doc = f"{group.describe()}: its output {output} at `idx`, given its row's reductions."
    lines = [
        "@triton.jit",
        f"def {name}({', '.join(params)}):",
        f'    """{doc}"""',
        *(f"    {ln}" for ln in body.lines),
    ]
    return "\n".join([*lines, f"    return {body.stored(group.outputs[output])}"]) + "\n"


def epilogue_params(group: FusedGroup, given: int) -> list[str]:
    """`pointwise_epilogue`'s parameters before `y`: `in<i>` for the group's inputs but `given`."""
    return [f"in{i}" for i in range(len(group.inputs)) if i != given]


def pointwise_epilogue(group: FusedGroup, given: int) -> str:
    """Source of `@triton.jit def _epilogue(in0.., y, offs, mask)`: the pointwise group's one
    output at the flat indices `offs` of its iteration space, as it would be stored, where its input `given`
    is `y` (float32, in registers: a product the calling kernel computed) rather than loaded. `y` is first
    rounded to that input's dtype, as the product's own store would. Parameters: `in<i>` for the group's
    other inputs (numbered as in its own kernel: `epilogue_params`), for a matrix-vector kernel that ends
    with the group (`codegen.triton.gemv_epilogue`)."""
    assert group.kind == "pointwise" and len(group.outputs) == 1, group.describe()
    body = GroupBody(group)
    tensor = group.inputs[given]
    ctype = compute_type(tensor.meta.dtype)
    rounded = "y" if tensor.meta.dtype == "float32" else f"y.to({TL[tensor.meta.dtype]}).to({TL[ctype]})"
    body.values[tensor.name] = body.let(rounded, ctype)
    for step in group.steps:
        body.step(step)
    params = ", ".join([*epilogue_params(group, given), "y", "offs", "mask"])
    doc = f"{group.describe()}: its output at `offs`, its input {given} the product `y`."
    return _returning(f"_epilogue({params})", doc, body)


@dataclass
class _CallingBody(GroupBody):
    """A group's code where some inputs are computed rather than loaded: `calls` maps each to the start of its
    call, "f(a, b, ", which its flat index in the value it views (the view's offset, then its address) and
    its mask complete (a row group's value at the element: `row_value`)."""

    calls: dict[str, str] = field(default_factory=dict)

    def operand(self, name: str) -> Operand:
        if name in self.calls and name not in self.values:
            tensor = self.tensors[name]
            address, where = _address(self.group, tensor, space=self.space)
            index = " + ".join(filter(None, (str(tensor.meta.offset) if tensor.meta.offset else "", address)))
            value = f"{self.calls[name]}{index or f'{self.space.index} * 0'}, {where or self.space.mask})"
            ctype = compute_type(tensor.meta.dtype)
            self.values[name] = self.let(value if ctype == tensor.meta.dtype else f"{value}.to({TL[ctype]})", ctype)
        return super().operand(name)


def _returning(signature: str, doc: str, body: GroupBody) -> str:
    """`@triton.jit def <signature>:` running the group's code and returning its one output as stored."""
    lines = ["@triton.jit", f"def {signature}:", f'    """{doc}"""', *(f"    {line}" for line in body.lines)]
    return "\n".join([*lines, f"    return {body.stored(body.group.outputs[0])}"]) + "\n"
