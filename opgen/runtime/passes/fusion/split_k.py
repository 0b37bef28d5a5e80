"""How many pieces of K a few-row product kernel may split its work into (`GemvPlan.split_k`).

A few-row kernel (`codegen.triton.few_rows`) gives each program BLOCK_N columns of the output, at least 16
of them (a tensor-core dot's smallest side). A narrow product over a long K then has few programs, each
walking all of K alone: Llama-3.2-1B's down projection at 8 rows (2048 columns, K = 8192) is 128 programs
for an H200's 132 SMs. With `split_k` pieces, a config may give each piece of K a program of its own (the
grid's second axis): the pieces' partial products go to a float32 buffer, each program takes a ticket from
its block's counter, and the block's last program sums the pieces in order, adds the bias and stores the
block (`fusion.split_buffers` makes the buffer and the zeroed counters in setup). Whether a split config
runs is the first call's timing; this only bounds it.

On an H200 (8 rows, bf16, each product a CUDA graph of plain launches over weights that miss the cache),
the down projection took 15.0 us unsplit, 12.9-13.0 us in 4 or 8 pieces, against cuBLAS's 13.8 us; the
q/k/v and output projections (K = 2048) gained nothing from a split.
"""

from __future__ import annotations

from opgen.runtime.ir import GemvPlan
from opgen.runtime.ir.plans import SPLIT_BLOCK_N

TARGET_PROGRAMS = 512  # blocks x pieces to aim at: a few programs per SM of an H100/H200 (132 SMs)
MAX_SPLIT = 8
PIECE_UNIT = 128  # a piece is a whole number of these (a few-row tile's shortest BLOCK_K), so no piece is empty


def split_k(plan: GemvPlan) -> int:
    """Pieces of K for `plan` at its narrowest tile: 1 (no split) for one row, a gated pair, or a launch
    that has TARGET_PROGRAMS / 2 programs unsplit; otherwise the most pieces, up to MAX_SPLIT and no more
    than TARGET_PROGRAMS needs, that cut K into equal whole numbers of PIECE_UNIT."""
    if plan.m == 1 or plan.gated or plan.k % PIECE_UNIT:
        return 1
    blocks = plan.blocks(SPLIT_BLOCK_N)
    if 2 * blocks >= TARGET_PROGRAMS:
        return 1
    wanted = min(MAX_SPLIT, -(-TARGET_PROGRAMS // blocks))
    units = plan.k // PIECE_UNIT
    return max(s for s in range(1, wanted + 1) if units % s == 0)
