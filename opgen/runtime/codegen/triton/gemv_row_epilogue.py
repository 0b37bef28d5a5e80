"""The Triton source of a matrix-vector kernel whose last program computes the row group reading its
product: a one-row `GemvPlan` with a `row_epilogue` (`opgen.runtime.passes.fusion.gemv_row_epilogue`).

Each program computes and stores its block of the product as the plain kernel does
(`codegen.triton.gemv`), then takes a ticket from the kernel's counter. The program that takes the last
one knows every block is stored: it sets the counter back to zero for the next launch and computes the
group's row whole (`group_parts.row_prologue`: the product read back from L2, the group's other inputs,
a few KB), storing every output of the group. The row is a norm's (with the residual add before it),
which the kernel after it reads: the launch of a row kernel of one program, and its wait, are gone.
"""

from __future__ import annotations

from opgen.runtime.codegen.triton import gemv
from opgen.runtime.codegen.triton.group_parts import row_prologue
from opgen.runtime.codegen.triton.module import jit_module, next_power_of_2
from opgen.runtime.ir import Config, GemvPlan

_LAST = """\
    tl.debug_barrier()  # every thread's stores of the block before the ticket (which releases them)
    ticket = tl.atomic_add(count, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:  # the last program: every block of the product is stored
        tl.atomic_xchg(count, 0)  # zero again for the next launch
        _row({args}, True, {block})"""


def kernel(plan: GemvPlan) -> tuple[str, str]:
    """(name, source). Parameters: the plain kernel's inputs (`gemv.kernel`), the group's other inputs
    (`r_in<i>`), the counter `count`; the product's output `out0`, then the group's outputs (`r_out<i>`)."""
    group, given = plan.row_epilogue, plan.row_epilogue_y
    assert group is not None and plan.m == 1 and plan.prologue is None and not plan.gated and len(plan.products) == 1
    params, meta, body, helpers = gemv.parts(plan)
    row, row_params = row_prologue(group, 0, store_returned=True, name="_row", uncached=frozenset({f"in{given}"}))
    inputs = [f"r_{p}" for i, p in enumerate(row_params) if p.startswith("in") and i != given]
    outputs = [f"r_{p}" for p in row_params if p.startswith("out")]
    args = [("out0" if i == given else f"r_{p}") if p.startswith("in") else f"r_{p}" for i, p in enumerate(row_params)]
    assert params[-1] == "out0", params
    params = [*params[:-1], *inputs, "count", "out0", *outputs]
    body += "\n" + _LAST.format(args=", ".join(args), block=next_power_of_2(group.shape[-1]))
    return jit_module("gemv", params, meta, body, f"{row}\n\n{helpers}")


def configs(plan: GemvPlan) -> tuple[Config, ...]:
    """The plain kernel's: the group's row is one program's work, whatever the tile."""
    return gemv.configs(plan)
