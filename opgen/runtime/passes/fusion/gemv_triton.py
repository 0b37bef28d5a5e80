"""The Triton source of a matrix-vector kernel (`opgen.runtime.passes.fusion.gemv`).

One program computes BLOCK_N rows of one product: it walks K in blocks of BLOCK_K, multiplying a
[BLOCK_N, BLOCK_K] tile of the weight by the input's block in float32, and sums the tile's rows at
the end. Programs are laid out product after product (the first product's blocks, then the
second's, ...), so one launch covers every sibling; the weights are streamed once (evict first),
the input, read by every program, stays in cache. Sizes and strides are literals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opgen.runtime.ir import TensorMeta

if TYPE_CHECKING:
    from opgen.runtime.passes.fusion.gemv import Siblings

Config = tuple[tuple[tuple[str, Any], ...], int, int, tuple[int, ...]]  # (meta, warps, stages, grid)
# (BLOCK_N, BLOCK_K, warps, stages): a few shapes of tile; the first call's autotuning keeps the fastest.
TILES = ((8, 512, 4, 3), (16, 256, 4, 3), (32, 128, 4, 4), (4, 1024, 4, 2), (16, 512, 8, 3))

_ROWS = '''@triton.jit
def _rows(x, w, bias, out, block, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr, SW: tl.constexpr,
          HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[rows] = w[rows, :] @ x (+ bias[rows]) for the block's BLOCK_N rows; w's rows are SW apart."""
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        xs = tl.load(x + cols * SX, mask=col_ok, other=0.0).to(tl.float32)
        tile = tl.load(w + rows[:, None] * SW + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                       eviction_policy="evict_first")
        acc += tile.to(tl.float32) * xs[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out + rows, y.to(out.dtype.element_ty), mask=row_ok)
'''


def source(name: str, group: Siblings, metas: dict[str, TensorMeta]) -> str:
    products = group.products
    outs = [p.line.outputs[0].name for p in products]  # type: ignore[union-attr]
    inputs = list(dict.fromkeys((group.x, *(p.w for p in products), *(p.bias for p in products if p.bias))))
    sx = group.x_meta.stride[1]
    lines = [
        "import triton",
        "import triton.language as tl",
        "",
        "",
        _ROWS,
        "",
        "@triton.jit",
        f"def {name}({', '.join((*inputs, *outs))}, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        f"    # graph nodes: {', '.join(f'{p.line.node} ({p.line.target})' for p in products)}",
        f"    # {len(products)} product(s) of one row of {group.k}: {' + '.join(str(p.n) for p in products)} rows",
        "    pid = tl.program_id(0)",
    ]
    start = ""
    calls = []
    for product, out in zip(products, outs, strict=True):
        blocks = f"({product.n} + BLOCK_N - 1) // BLOCK_N"
        end = f"{start} + {blocks}" if start else blocks
        block = f"pid - ({start})" if start else "pid"
        args = [group.x, product.w, product.bias or out, out, block, product.n, group.k, sx]
        args += [metas[product.w].stride[1], product.bias is not None, "BLOCK_N", "BLOCK_K"]
        calls.append((end, f"_rows({', '.join(map(str, args))})"))
        start = end
    if len(calls) == 1:
        lines.append(f"    {calls[0][1]}")
    else:
        for i, (end, call) in enumerate(calls):
            test = "else:" if i == len(calls) - 1 else f"{'if' if i == 0 else 'elif'} pid < {end}:"
            lines += [f"    {test}", f"        {call}"]
    return "\n".join(lines) + "\n"


def configs(group: Siblings) -> tuple[Config, ...]:
    k_blocks = 1 << max(4, math.ceil(math.log2(group.k)))  # the smallest power of two >= K (at least 16)
    found: list[Config] = []
    for block_n, block_k, warps, stages in TILES:
        block_k = min(block_k, k_blocks)
        grid = (sum(-(-p.n // block_n) for p in group.products),)
        config: Config = ((("BLOCK_N", block_n), ("BLOCK_K", block_k)), warps, stages, grid)
        if config not in found:
            found.append(config)
    return tuple(found)
