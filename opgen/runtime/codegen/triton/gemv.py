"""The Triton source of a matrix-vector kernel (a `GemvPlan` of `opgen.runtime.passes.fusion.gemv`).

One program computes BLOCK_N rows of one product: it walks K in blocks of BLOCK_K, multiplying a
[BLOCK_N, BLOCK_K] tile of the weight by the input's block in float32, and sums the tile's rows at
the end. Programs are laid out product after product (the first product's blocks, then the
second's, ...), so one launch covers every sibling; the weights are streamed once (evict first),
the input, read by every program, stays in cache. Sizes and strides are literals; names are not
(see `kernel`), so a model's layers share their kernels.
"""

from __future__ import annotations

from opgen.runtime.codegen.triton import gemv_epilogue
from opgen.runtime.codegen.triton.module import jit_module, next_power_of_2
from opgen.runtime.codegen.triton.ops import gelu, silu
from opgen.runtime.ir import Config, GemvPlan

# (BLOCK_N, BLOCK_K, warps, stages): three shapes of tile (each one compile); the first call's autotuning
# keeps the fastest. Narrow and long wins: on an H100 (bf16, weights streamed from memory) two rows
# by 1024 columns with 4 warps was the fastest of 48 tiles on every Llama-3.2-1B product (K 2048-8192,
# N 2048-128256: 1.8-3.1 TB/s, 5-27% less time than the best of the 8x512/16x256/4x1024 tiles before
# it); the other two are the next best on some shapes.
TILES = ((2, 1024, 4, 3), (4, 1024, 8, 3), (8, 512, 8, 3))
META = "BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr"

# Both helpers read the first tile of weights before anything else: where kernels launch dependently
# (`passes.dependent_launch`), the wait for the kernel before comes after it, so the weights (which
# no kernel writes) stream in while that kernel finishes. {signal} and {wait} are those two calls.
_ROWS = '''@triton.jit
def _rows(x@E@, w, bias, out, block, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr, SW: tl.constexpr,
          HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[rows] = w[rows, :] @ x (+ bias[rows]) for the block's BLOCK_N rows; w's rows are SW apart."""
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
{signal}    tile = tl.load(w + rows[:, None] * SW + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                   eviction_policy="evict_first")
{wait}    xs = tl.load(x + cols * SX, mask=col_ok, other=0.0).to(tl.float32)
    acc = tile.to(tl.float32) * xs[None, :]
    for start in range(BLOCK_K, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        xs = tl.load(x + cols * SX, mask=col_ok, other=0.0).to(tl.float32)
        tile = tl.load(w + rows[:, None] * SW + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                       eviction_policy="evict_first")
        acc += tile.to(tl.float32) * xs[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out + rows, @STORE@, mask=row_ok)
'''

_GATED = '''@triton.jit
def _gated(x, wg, wu, out, block, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr, SG: tl.constexpr,
           SU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[rows] = silu(wg[rows, :] @ x) * (wu[rows, :] @ x), each product and the silu rounded to out's
    dtype as the separate calls store them."""
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
    tile_ok = row_ok[:, None] & col_ok[None, :]
{signal}    g = tl.load(wg + rows[:, None] * SG + cols[None, :], mask=tile_ok, other=0.0, eviction_policy="evict_first")
    u = tl.load(wu + rows[:, None] * SU + cols[None, :], mask=tile_ok, other=0.0, eviction_policy="evict_first")
{wait}    xs = tl.load(x + cols * SX, mask=col_ok, other=0.0).to(tl.float32)
    acc_g = g.to(tl.float32) * xs[None, :]
    acc_u = u.to(tl.float32) * xs[None, :]
    for start in range(BLOCK_K, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        xs = tl.load(x + cols * SX, mask=col_ok, other=0.0).to(tl.float32)
        tile_ok = row_ok[:, None] & col_ok[None, :]
        g = tl.load(wg + rows[:, None] * SG + cols[None, :], mask=tile_ok, other=0.0, eviction_policy="evict_first")
        u = tl.load(wu + rows[:, None] * SU + cols[None, :], mask=tile_ok, other=0.0, eviction_policy="evict_first")
        acc_g += g.to(tl.float32) * xs[None, :]
        acc_u += u.to(tl.float32) * xs[None, :]
    tl.store(out + rows, _swiglu(tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1), out), mask=row_ok)
'''

# The gated kernels' last step (one row's, a few rows', a prologue's), the helper before their `_gated`:
# `act(g) * u`, act the plan's activation, in float32 (as ATen's kernels compute it in half precision).
ACTIVATIONS = {"silu": silu("g"), "gelu": gelu("g", "none"), "gelu_tanh": gelu("g", "tanh")}  # as fused kernels


def gated_helper(activation: str) -> str:
    """Source of `_swiglu(g, u, out)`: `activation(g) * u` in out's dtype from float32 products, each
    product and the activation rounded to that dtype as the separate calls store them."""
    return f'''@triton.jit
def _swiglu(g, u, out):
    """{activation}(g) * u in out's dtype, each product and the {activation} rounded to it."""
    dtype = out.dtype.element_ty
    g = g.to(dtype).to(tl.float32)
    u = u.to(dtype).to(tl.float32)
    s = ({ACTIVATIONS[activation]}).to(dtype).to(tl.float32)
    return (s * u).to(dtype)


'''


def dependent_helper(template: str, dependent: bool) -> str:
    """A helper's source, with the signal and the wait where the kernel launches dependently."""
    signal = "    tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start: it waits for this one\n"
    wait = (
        "    tl.extra.cuda.gdc_wait()  # the kernel before has finished (the weights, read above, no kernel writes)\n"
    )
    return template.format(signal=signal if dependent else "", wait=wait if dependent else "")


def kernel(plan: GemvPlan) -> tuple[str, str]:
    """(name, source) of the plan's kernel. Both depend only on the sizes, strides and whether each
    product has a bias, never on value names: the layers of a model share one kernel, compiled and tuned
    once. Parameters: the input `x`, the weights `w0..`, the biases `b0..`, then the outputs `out0..`.
    `plan.gated`: a gate and an up product (no biases), one output `silu(gate) * up` (`gemv_gated`).
    `plan.dependent`: the weights' first tile is read before waiting for the kernel before (`dependent_helper`)."""
    x = ("x", *gemv_epilogue.parameters(plan))
    body, params = kernel_body(plan, f"one row of {plan.k}", "_rows", [], [plan.x_stride], [], x=x)
    if plan.gated:
        helper = dependent_helper(gated_helper(plan.activation) + _GATED, plan.dependent)
        return jit_module("gemv", params, META, body, helper)
    helper = gemv_epilogue.finish(dependent_helper(_ROWS, plan.dependent), plan, "y", "rows", "row_ok")
    return jit_module("gemv", params, META, body, helper)


def kernel_body(plan: GemvPlan, of: str, helper: str, lead: list[int], x_strides: list[int], tail: list[int],
                x: tuple[str, ...] = ("x",), x_outputs: tuple[str, ...] = ()) -> tuple[str, list[str]]:  # fmt: skip
    """(body, parameters) of a product kernel: each program calls `helper` (`_gated` for a gated pair) for
    its block of its product's rows, the products' blocks one after another. A helper's arguments:
    *x, *x_outputs, w, bias, out, block, *lead, N, K, *x_strides, the weight's row stride, HAS_BIAS,
    *tail, BLOCK_N, BLOCK_K (a gated pair's: *x, *x_outputs, the gate's and up's weights, out, block,
    *lead, N, K, *x_strides, both row strides, *tail, BLOCK_N, BLOCK_K). `x`: the input's parameters
    (a prologue's inputs: `codegen.triton.gemv_prologue`), `x_outputs`: outputs before the products'."""
    products = plan.products
    inputs = [*x, *x_outputs]
    if plan.gated:
        gate, up = products
        args = [*inputs, "w0", "w1", "out0", "pid", *lead, gate.n, plan.k, *x_strides, gate.row_stride]
        args += [up.row_stride, *tail, "BLOCK_N", "BLOCK_K"]
        body = [f"    # silu(gate) * up of {of}: {gate.n} rows", "    pid = tl.program_id(0)"]
        body.append(f"    _gated({', '.join(map(str, args))})")
        return "\n".join(body), [*x, "w0", "w1", *x_outputs, "out0"]
    biases = [f"b{i}" for i, p in enumerate(products) if p.bias]
    outs = [*x_outputs, *(f"out{i}" for i in range(len(products)))]
    params = [*x, *(f"w{i}" for i in range(len(products))), *biases, *outs]
    rows = " + ".join(str(p.n) for p in products)
    body = [f"    # {len(products)} product(s) of {of}: {rows} rows", "    pid = tl.program_id(0)"]
    start = ""
    calls = []
    for i, product in enumerate(products):
        blocks = f"({product.n} + BLOCK_N - 1) // BLOCK_N"
        end = f"{start} + {blocks}" if start else blocks
        block = f"pid - ({start})" if start else "pid"
        bias = f"b{i}" if product.bias else f"out{i}"
        args = [*inputs, f"w{i}", bias, f"out{i}", block, *lead, product.n, plan.k, *x_strides]
        args += [product.row_stride, product.bias, *tail, "BLOCK_N", "BLOCK_K"]
        calls.append((end, f"{helper}({', '.join(map(str, args))})"))
        start = end
    if len(calls) == 1:
        body.append(f"    {calls[0][1]}")
    else:
        for i, (end, call) in enumerate(calls):
            test = "else:" if i == len(calls) - 1 else f"{'if' if i == 0 else 'elif'} pid < {end}:"
            body += [f"    {test}", f"        {call}"]
    return "\n".join(body), params


def grid_blocks(plan: GemvPlan, block_n: int) -> tuple[int]:
    """The grid: every product's blocks of `block_n` rows (a gated pair's once: a program does both)."""
    return (plan.blocks(block_n),)


def configs(plan: GemvPlan) -> tuple[Config, ...]:
    """Per tile, the grid covers every product's rows (a gated pair's once: a program does both)."""
    k_blocks = max(16, next_power_of_2(plan.k))  # the smallest power of two >= K (at least 16)
    found: list[Config] = []
    for block_n, block_k, warps, stages in TILES:
        block_k = min(block_k, k_blocks)
        config: Config = ((("BLOCK_N", block_n), ("BLOCK_K", block_k)), warps, stages, grid_blocks(plan, block_n))
        if config not in found:
            found.append(config)
    return tuple(found)
