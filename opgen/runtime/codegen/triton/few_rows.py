"""The Triton source of a few-row product kernel: a `GemvPlan` of 2 to 64 input rows
(`opgen.runtime.passes.fusion.gemv`), as tensor-core tiles.

Batched decode multiplies a few rows (one token per sequence) by every weight: still bound by memory,
each weight must be read once for all the rows. One program computes BLOCK_N columns of one product
for every row: it walks K in blocks of BLOCK_K, loading a [BLOCK_K, BLOCK_N] tile of the weight (its
rows contiguous along K, streamed once: evict first) and the rows' [BLOCK_M, BLOCK_K] block of the
input (read by every program: it stays in cache), and accumulates their `tl.dot` in float32 (tensor
cores; float32 inputs at full precision, as torch's matmul without TF32). BLOCK_M is the rows rounded
up to a power of two, at least 16 (the smallest dot). Programs are laid out product after product, as
the matrix-vector kernel's are (`codegen.triton.gemv`), so one launch covers every sibling.
"""

from __future__ import annotations

from opgen.runtime.codegen.triton import gemv_epilogue
from opgen.runtime.codegen.triton.gemv import META, dependent_helper, gated_helper, grid_blocks, kernel_body
from opgen.runtime.codegen.triton.module import ieee_dot, jit_module, next_power_of_2
from opgen.runtime.ir import Config, GemvPlan

# (BLOCK_N, BLOCK_K, warps, stages): the first call's autotuning keeps the fastest. Small BLOCK_N: more
# programs to spread a narrow product over the GPU; deep pipelines: more weight bytes in flight.
TILES = ((16, 256, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 3))
SHARED_BYTES = 160 * 1024  # a config's pipeline buffers (float32 at worst) stay under this: fewer stages, then K


def _dots(*pairs: tuple[str, str]) -> str:
    """Each `acc += xs @ tile` (float32 inputs at full precision)."""
    return "\n".join(ieee_dot(acc, "xs", tile, "x.dtype.element_ty", 4, acc=acc) for acc, tile in pairs)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.split("\n"))


# The helpers read the first tile of weights before anything else, as the matrix-vector kernel's do:
# where kernels launch dependently, the wait for the kernel before comes after it.
_TILES = f'''@triton.jit
def _tiles(x@E@, w, bias, out, block, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SXM: tl.constexpr,
           SX: tl.constexpr, SW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[:, cols] = x @ w[cols, :].T (+ bias[cols]) for the block's BLOCK_N columns, every row of x."""
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
{{signal}}    tile = tl.load(w + cols[None, :] * SW + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0,
                   eviction_policy="evict_first")
{{wait}}    xs = tl.load(x + ms[:, None] * SXM + ks[None, :] * SX, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
{_dots(("acc", "tile"))}
    for start in range(BLOCK_K, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        xs = tl.load(x + ms[:, None] * SXM + ks[None, :] * SX, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        tile = tl.load(w + cols[None, :] * SW + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0,
                       eviction_policy="evict_first")
{_indent(_dots(("acc", "tile")))}
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out + ms[:, None] * N + cols[None, :], @STORE@, mask=m_ok[:, None] & col_ok[None, :])
'''

_GATED = f'''@triton.jit
def _gated(x, wg, wu, out, block, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SXM: tl.constexpr,
           SX: tl.constexpr, SG: tl.constexpr, SU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """out[:, cols] = silu(x @ wg[cols, :].T) * (x @ wu[cols, :].T), each product and the silu rounded to
    out's dtype as the separate calls store them."""
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    tile_ok = k_ok[:, None] & col_ok[None, :]
{{signal}}    g = tl.load(wg + cols[None, :] * SG + ks[:, None], mask=tile_ok, other=0.0, eviction_policy="evict_first")
    u = tl.load(wu + cols[None, :] * SU + ks[:, None], mask=tile_ok, other=0.0, eviction_policy="evict_first")
{{wait}}    xs = tl.load(x + ms[:, None] * SXM + ks[None, :] * SX, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
{_dots(("acc_g", "g"), ("acc_u", "u"))}
    for start in range(BLOCK_K, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        tile_ok = k_ok[:, None] & col_ok[None, :]
        xs = tl.load(x + ms[:, None] * SXM + ks[None, :] * SX, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(wg + cols[None, :] * SG + ks[:, None], mask=tile_ok, other=0.0, eviction_policy="evict_first")
        u = tl.load(wu + cols[None, :] * SU + ks[:, None], mask=tile_ok, other=0.0, eviction_policy="evict_first")
{_indent(_dots(("acc_g", "g"), ("acc_u", "u")))}
    tl.store(out + ms[:, None] * N + cols[None, :], _swiglu(acc_g, acc_u, out), mask=m_ok[:, None] & col_ok[None, :])
'''


def block_m(plan: GemvPlan) -> int:
    """The rows of a tile: the plan's rows rounded up to a power of two, at least 16 (the smallest dot)."""
    return max(16, next_power_of_2(plan.m))


def kernel(plan: GemvPlan) -> tuple[str, str]:
    """(name, source) of the plan's kernel: as the matrix-vector kernel's (`gemv.kernel`: parameters, one
    launch for every sibling, names shared by layers), its helpers tensor-core tiles over the rows."""
    of, strides = f"{plan.m} rows of {plan.k}", [plan.x_row_stride, plan.x_stride]
    x = ("x", *gemv_epilogue.parameters(plan))
    body, params = kernel_body(plan, of, "_tiles", [plan.m], strides, [block_m(plan)], x=x)
    if plan.gated:
        helpers = dependent_helper(gated_helper(plan.activation) + _GATED, plan.dependent)
        return jit_module("gemm_rows", params, META, body, helpers)
    flat, mask = "ms[:, None] * N + cols[None, :]", "m_ok[:, None] & col_ok[None, :]"
    helpers = gemv_epilogue.finish(dependent_helper(_TILES, plan.dependent), plan, "acc", flat, mask)
    return jit_module("gemm_rows", params, META, body, helpers)


def configs(plan: GemvPlan) -> tuple[Config, ...]:
    """Per tile, the grid covers every product's columns (a gated pair's once: a program does both); a
    tile whose pipeline would not fit in shared memory takes fewer stages, then shorter blocks of K."""
    k_blocks = max(16, next_power_of_2(plan.k))  # the smallest power of two >= K (at least 16)
    m, weights = block_m(plan), 2 if plan.gated else 1
    found: list[Config] = []
    for block_n, block_k, warps, stages in TILES:
        block_k = min(block_k, k_blocks)
        while stages * (m + weights * block_n) * block_k * 4 > SHARED_BYTES and block_k > 16:
            if stages > 2:
                stages -= 1
            else:
                block_k //= 2
        config: Config = ((("BLOCK_N", block_n), ("BLOCK_K", block_k)), warps, stages, grid_blocks(plan, block_n))
        if config not in found:
            found.append(config)
    return tuple(found)
