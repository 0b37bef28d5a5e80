"""The Triton source of a few-row product kernel that computes its input rows first: a `GemvPlan` of 2 to
64 rows with a `prologue` (`opgen.runtime.passes.fusion.gemv_prologue`).

The input rows are the output of a row group (a norm, with the residual add before it). The kernel is
the few-row kernel (`codegen.triton.few_rows`: tensor-core tiles walking K), its rows' blocks computed
rather than loaded (`group_blocks`): once its first tile of weights is read (and, launched dependently,
the kernel before has finished), each program sums the group's reductions over its rows (`_sums`: the
group's inputs, a few KB a row, read from cache), then computes each block of the rows where it would
load it (`_block`), from reads made one step of K ahead (`_loads`). The first program also stores the
group's other outputs (the residual sum the next layer reads), and the rows themselves where lines after
the kernel read them (`prologue_stored`).
"""

from __future__ import annotations

from opgen.runtime.codegen.triton.few_rows import Rows, block_m, helpers
from opgen.runtime.codegen.triton.gemv import META, kernel_body
from opgen.runtime.codegen.triton.group_blocks import block_prologue
from opgen.runtime.codegen.triton.module import jit_module
from opgen.runtime.ir import GemvPlan


def kernel(plan: GemvPlan) -> tuple[str, str]:
    """(name, source). Parameters as the one-row prologue kernel's (`codegen.triton.gemv_prologue`): the
    group's inputs (`p_in0..`), the weights, the biases, the group's other outputs (`p_out<i>`), the
    products' outputs (`out0..`)."""
    assert plan.prologue is not None and plan.m > 1
    prologue, params, sums, loads = block_prologue(plan.prologue, plan.prologue_x, plan.prologue_stored)
    inputs = tuple(f"p_{p}" for p in params if p.startswith("in"))
    outputs = tuple(f"p_{p}" for p in params if p.startswith("out"))
    ins, totals = ", ".join(p for p in params if p.startswith("in")), ", ".join(sums)
    loaded = ", ".join(f"l{i}" for i in range(loads))
    first = (f"    {totals} = _sums({ins}, BLOCK_M, BLOCK_K)\n"
             "    store = tl.program_id(0) == 0  # the first program stores the group's other outputs\n"
             f"    {loaded} = _loads({ins}, 0, BLOCK_M, BLOCK_K)\n")  # fmt: skip
    args = ", ".join([loaded, *(p for p in params if p.startswith("out")), totals])
    block = (f"xs = _block({args}, {{start}}, store, BLOCK_M, BLOCK_K)\n"
             f"{loaded} = _loads({ins}, {{start}} + BLOCK_K, BLOCK_M, BLOCK_K)  # the next block's")  # fmt: skip
    rows = Rows(", ".join(params), "", first, block)
    of = f"{plan.m} rows of {plan.k}, computed first ({plan.prologue.describe()})"
    body, kernel_params = kernel_body(plan, of, "_tiles", [plan.m], [], [block_m(plan)], x=inputs, x_outputs=outputs)
    return jit_module("gemm_rows", kernel_params, META, body, f"{prologue}\n\n{helpers(plan, rows)}")
