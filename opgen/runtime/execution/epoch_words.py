"""What opgen's kernels over peer memory share: 8-byte words that carry a call's epoch, read until they do.

A value (or 32 bits of values) travels to a peer in one uint64 word: the data in the low half, the call's
epoch in the high half. A GPU stores an aligned 8-byte word whole, so a word that carries this call's
epoch carries this call's data (NCCL's low-latency protocol, LL). Epochs run from 1 to `EPOCHS`, which is
even so that two slots taken in turn (call `e` uses slot `e % 2`) keep their turn; buffers start zeroed,
and no epoch is 0. `execution.peer_sum_kernel` and `execution.peer_gather_kernel` use these.

This module imports triton at import time (a @triton.jit function needs it): only those kernels' modules
import it, when a graph that runs them is bound.
"""

from __future__ import annotations

import triton
import triton.language as tl

EPOCHS = 1 << 30  # the counter wraps here; words carry epochs 1..EPOCHS


@triton.jit
def arrived(at, ok, epoch, TIMEOUT_NS: tl.constexpr):
    """The words at `at` (where `ok`) once every one carries `epoch`: read again (volatile) until they do.
    After TIMEOUT_NS nanoseconds without them the kernel stops (`gone`); TIMEOUT_NS 0 waits for ever and reads
    no clock (Triton's interpreter has none)."""
    words = tl.load(at, mask=ok, other=0, volatile=True)
    pending = ok & ((words >> 32).to(tl.uint32) != epoch)
    if TIMEOUT_NS > 0:
        start = tl.extra.cuda.globaltimer()
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        words = tl.where(pending, tl.load(at, mask=pending, other=0, volatile=True), words)
        pending = ok & ((words >> 32).to(tl.uint32) != epoch)
        if TIMEOUT_NS > 0:
            if tl.extra.cuda.globaltimer() - start > TIMEOUT_NS:
                gone()
    return words


@triton.jit
def gone():
    """Stop the kernel: a peer's words never came (its rank died, hangs, or stopped calling in step). Every
    thread traps, which ends the process's work on the GPU: its next CUDA call raises (torch: "CUDA error:
    unspecified launch failure"), as a stuck NCCL collective ends at its process group's timeout, where
    waiting would hang for ever. (A device printf before the trap printed nothing on an H200: the trap
    discards it.)"""
    tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def this_call(counters, program, EPOCHS: tl.constexpr, WORLD: tl.constexpr, SLOT: tl.constexpr):
    """`program`'s epoch for this call (its counter's last plus one, wrapping after EPOCHS), that epoch as
    the words carry it (uint32), and the offset of this call's slot in a buffer (words: slots of WORLD
    parts of SLOT words, taken in turn)."""
    epoch = tl.load(counters + program) % EPOCHS + 1
    return epoch, epoch.to(tl.uint32), (epoch % 2) * WORLD * SLOT
