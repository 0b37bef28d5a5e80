"""The Triton source of a matrix-vector kernel that computes its input row first: a one-row `GemvPlan`
with a `prologue` (`opgen.runtime.passes.fusion.gemv_prologue`).

The input row is the output of a row group of one row (a norm, with the residual add before it): each
program reads its whole tile of weights (one step of K: BLOCK_K covers the row), then computes the row
itself (`group_parts.row_prologue`: the group's inputs, a few KB, read from cache) and multiplies. The first
program also stores the group's other outputs (the residual sum the next layer reads), and the row itself
where lines after the kernel read it too (`prologue_stored`: a post-norm layer's residual stream). Where kernels
launch dependently, the tile is read before the wait for the kernel before, as in `codegen.triton.gemv`:
the weights stream in while that kernel finishes. Laid out and named as the plain kernel is (one
launch for every sibling; names shared by a model's layers).
"""

from __future__ import annotations

from opgen.runtime.codegen.triton import gemv_epilogue
from opgen.runtime.codegen.triton.gemv import META, dependent_helper, gated_helper, kernel_body
from opgen.runtime.codegen.triton.group_parts import row_prologue
from opgen.runtime.codegen.triton.module import jit_module
from opgen.runtime.ir import Config, GemvPlan

# {x}: the prologue's parameters. `xs` is zero past K (the tile is too: their products add nothing).
_ROWS = """@triton.jit
def _rows({x}, w, bias, out, block, N: tl.constexpr, K: tl.constexpr, SW: tl.constexpr, HAS_BIAS: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    \"\"\"out[rows] = w[rows, :] @ x (+ bias[rows]), x the prologue's row.\"\"\"
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
{signal}    tile = tl.load(w + rows[:, None] * SW + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                   eviction_policy="evict_first")
{wait}    xs = tl.where(col_ok, tl.reshape(_prologue({x}, tl.program_id(0) == 0, BLOCK_K), (BLOCK_K,)), 0.0)
    y = tl.sum(tile.to(tl.float32) * xs[None, :], axis=1)
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out + rows, @STORE@, mask=row_ok)
"""

_GATED = """@triton.jit
def _gated({x}, wg, wu, out, block, N: tl.constexpr, K: tl.constexpr, SG: tl.constexpr, SU: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    \"\"\"out[rows] = silu(wg[rows, :] @ x) * (wu[rows, :] @ x), x the prologue's row, each product and the
    silu rounded to out's dtype as the separate calls store them.\"\"\"
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
    tile_ok = row_ok[:, None] & col_ok[None, :]
{signal}    g = tl.load(wg + rows[:, None] * SG + cols[None, :], mask=tile_ok, other=0.0, eviction_policy="evict_first")
    u = tl.load(wu + rows[:, None] * SU + cols[None, :], mask=tile_ok, other=0.0, eviction_policy="evict_first")
{wait}    xs = tl.where(col_ok, tl.reshape(_prologue({x}, tl.program_id(0) == 0, BLOCK_K), (BLOCK_K,)), 0.0)
    g = tl.sum(g.to(tl.float32) * xs[None, :], axis=1)
    u = tl.sum(u.to(tl.float32) * xs[None, :], axis=1)
    tl.store(out + rows, _swiglu(g, u, out), mask=row_ok)
"""


def kernel(plan: GemvPlan) -> tuple[str, str]:
    """(name, source). Parameters: the prologue's inputs (`p_in0..`), the epilogue's (`e_in<i>`, where there
    is one), the weights, the biases, the prologue's other outputs (`p_out<i>`), the products' outputs
    (`out0..`; an epilogue's output in place of its product)."""
    assert plan.prologue is not None and plan.m == 1
    prologue, params = row_prologue(plan.prologue, plan.prologue_x, plan.prologue_stored)
    given = gemv_epilogue.parameters(plan)  # the epilogue's inputs, after the prologue's
    inputs = (*(f"p_{p}" for p in params if p.startswith("in")), *given)
    outputs = tuple(f"p_{p}" for p in params if p.startswith("out"))
    of = f"one row of {plan.k}, computed first ({plan.prologue.describe()})"
    body, kernel_params = kernel_body(plan, of, "_rows", [], [], [], x=inputs, x_outputs=outputs)
    signature = [*(p for p in params if p.startswith("in")), *given, *(p for p in params if p.startswith("out"))]
    template = gated_helper(plan.activation) + _GATED if plan.gated else _ROWS
    helper = dependent_helper(template.replace("{x}", ", ".join(signature)), plan.dependent)
    helper = gemv_epilogue.finish(helper, plan, "y", "rows", "row_ok")
    return jit_module("gemv", kernel_params, META, body, f"{prologue}\n\n{helper}")


def configs(plan: GemvPlan) -> tuple[Config, ...]:
    """Per BLOCK_N whose tile of whole rows fits (`GemvPlan.whole_row_tiles`), warps by its size; the grid
    covers every product's rows (a gated pair's once)."""
    k = plan.whole_row_k()
    tiles = 2 if plan.gated else 1
    return tuple(
        ((("BLOCK_N", block_n), ("BLOCK_K", k)), 4 if tiles * block_n * k <= 8192 else 8, 1, (plan.blocks(block_n),))
        for block_n in plan.whole_row_tiles()
    )
