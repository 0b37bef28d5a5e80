"""The Triton kernel of opgen's one-shot all-reduce over peer memory (`execution.peer_sum`).

This module imports triton at import time (a @triton.jit function needs it): only `execution.peer_sum`
imports it, when a graph with such an all-reduce is bound.

One program sums a small tensor over the ranks of a group, in place, with one barrier:

1. It copies the tensor into its slot of this rank's mapped buffer. Each buffer has two slots, taken in
   turn: call `epoch` uses slot `epoch % 2`.
2. It raises its flag in every peer's flags (`epoch + 1`, a release at system scope), then waits until
   every peer's flag in its own flags reads `epoch + 1`, or the epoch after (an acquire at system scope).
3. It sums every rank's slot, in rank order (every rank adds the same values in the same order, so all
   hold the same bits), into the tensor, and stores `epoch + 1` into its counter.

Launched dependently (Hopper and newer, as opgen's generated kernels are), it lets the next kernel start
at once, so that kernel's weight reads overlap this one's wait for its peers, and waits for the kernel
before it first: a chain of such kernels may have started before this one ends, each waiting for the
one before it, so nothing here (the counter included) is read before that wait.

A rank writes a slot again two calls later, after the barrier of the call between, which each peer
passes only after it has read that slot: so one barrier suffices, where a kernel with one buffer needs a
second barrier before it returns (torch's `one_shot_all_reduce`). A peer runs at most one call ahead (it
waits for this rank's flag of the call before), so a flag reads either this call's value or the next.
Epochs count modulo `EPOCHS` (even, so the slots keep their turn), and flags compare for equality: no
overflow, however long the process runs.
"""

from __future__ import annotations

import triton
import triton.language as tl

EPOCHS = 1 << 30  # the counter wraps here; flags hold 1..EPOCHS


@triton.jit
def _flag(flags, rank):
    """The flag of `rank` in `flags`, read with an acquire at system scope."""
    return tl.atomic_add(flags + rank, 0, sem="acquire", scope="sys")


@triton.jit
def peer_sum_kernel(x, buffers, flags, counter, NUMEL: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
                    SLOT: tl.constexpr, EPOCHS: tl.constexpr, BLOCK: tl.constexpr,
                    DEPENDENT: tl.constexpr):  # fmt: skip
    """x[:NUMEL] = the sum over the group's ranks of their x, in place. `buffers`, `flags`: each rank's mapped
    buffer (two slots of SLOT elements) and flags (WORLD int32), as int64 addresses; `counter`: this rank's
    epoch (int32, device memory). DEPENDENT: launched dependently (`passes.dependent_launch`): the next
    kernel may start at once, and reads its weights while this one waits for its peers; this one waits
    for the kernel before it (which wrote x, and after the last call, the counter) before anything else."""
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    epoch = tl.load(counter)
    want = epoch + 1
    later = want % EPOCHS + 1
    offsets = tl.arange(0, BLOCK)
    dtype = x.dtype.element_ty
    slot = (epoch % 2) * SLOT
    mine = tl.load(buffers + RANK).to(tl.pointer_type(dtype))
    for start in tl.static_range(0, NUMEL, BLOCK):  # unrolled: every block's reads in flight at once
        at = start + offsets
        tl.store(mine + slot + at, tl.load(x + at, mask=at < NUMEL), mask=at < NUMEL)
    tl.debug_barrier()  # every thread's copy is in before the flags go up
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            raised = tl.load(flags + peer).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(raised + RANK, want, sem="release", scope="sys")
    own = tl.load(flags + RANK).to(tl.pointer_type(tl.int32))
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            seen = _flag(own, peer)
            while (seen != want) & (seen != later):
                seen = _flag(own, peer)
    tl.debug_barrier()  # no thread reads a peer's slot before its flag was seen
    for start in tl.static_range(0, NUMEL, BLOCK):  # unrolled: every block's reads in flight at once
        at = start + offsets
        total = tl.zeros((BLOCK,), tl.float32)
        for rank in tl.static_range(WORLD):
            theirs = tl.load(buffers + rank).to(tl.pointer_type(dtype))
            total += tl.load(theirs + slot + at, mask=at < NUMEL, other=0.0, cache_modifier=".cv").to(tl.float32)
        tl.store(x + at, total.to(dtype), mask=at < NUMEL)
    tl.store(counter, want % EPOCHS)
