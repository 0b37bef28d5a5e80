"""The last step of a few-row product split into pieces of K (`passes.fusion.split_k`): `_finish`, the
helper a piece's program calls with its partial product instead of storing the block.

Each program writes its piece's float32 partial product to `part` ([pieces, rows, columns], the block's
columns at `col_at` among every product's), then takes a ticket from its block's counter (an atomic add
after a barrier, which releases every thread's stores). The program that draws the last ticket sums the
pieces in their order, so the sum does not depend on which arrives last, adds the bias, stores the block
in the output's dtype, and sets the counter back to zero for the next launch: no kernel clears the
buffers, and a CUDA graph replays them as they are.
"""

from __future__ import annotations

FINISH = '''@triton.jit
def _finish(acc, bias, out, part, count, ticket, col_at, cols, ms, M: tl.constexpr, N: tl.constexpr,
            NT: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """This piece's partial product `acc` [BLOCK_M, BLOCK_N] to `part`; the block's last program sums the
    pieces in order (+ bias[cols]) into out[:, cols] and zeroes the block's counter `count[ticket]`."""
    col_ok = cols < N
    ok = (ms < M)[:, None] & col_ok[None, :]
    at = ms[:, None] * NT + (col_at + cols)[None, :]
    tl.store(part + tl.program_id(1) * (M * NT) + at, acc, mask=ok)
    tl.debug_barrier()  # every thread's stores before the ticket (which releases them)
    if tl.atomic_add(count + ticket, 1, sem="acq_rel") == SPLIT - 1:  # the others' pieces are all written
        tl.atomic_xchg(count + ticket, 0)  # zero again for the next launch
        total = tl.zeros_like(acc)
        for piece in tl.static_range(SPLIT):
            total += tl.load(part + piece * (M * NT) + at, mask=ok, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out + ms[:, None] * N + cols[None, :], total.to(out.dtype.element_ty), mask=ok)
'''
