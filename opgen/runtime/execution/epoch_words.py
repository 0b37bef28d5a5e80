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
def arrived(at, ok, epoch):
    """The words at `at` (where `ok`) once every one carries `epoch`: read again (volatile) until they do."""
    words = tl.load(at, mask=ok, other=0, volatile=True)
    pending = ok & ((words >> 32).to(tl.uint32) != epoch)
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        words = tl.where(pending, tl.load(at, mask=pending, other=0, volatile=True), words)
        pending = ok & ((words >> 32).to(tl.uint32) != epoch)
    return words


@triton.jit
def this_call(counters, program, EPOCHS: tl.constexpr, WORLD: tl.constexpr, SLOT: tl.constexpr):
    """`program`'s epoch for this call (its counter's last plus one, wrapping after EPOCHS), that epoch as
    the words carry it (uint32), and the offset of this call's slot in a buffer (words: slots of WORLD
    parts of SLOT words, taken in turn)."""
    epoch = tl.load(counters + program) % EPOCHS + 1
    return epoch, epoch.to(tl.uint32), (epoch % 2) * WORLD * SLOT
