"""The Triton kernel of opgen's one-shot all-reduce over peer memory (`execution.peer_sum`).

This module imports triton at import time (a @triton.jit function needs it): only `execution.peer_sum`
imports it, when a graph with such an all-reduce is bound.

One program sums a small tensor over the ranks of a group, in place. Each value travels with the call's
epoch in one 8-byte word: the value's bits in the low half, the epoch in the high half. A GPU stores an
aligned 8-byte word whole, so a word that carries this call's epoch carries this call's value. NCCL's
low-latency protocol (LL) works the same way. There are no flags, fences or barriers: a peer's value
can be read as soon as it lands.

1. The program sends each of its values, as a word with this call's epoch, into its place in every
   peer's mapped buffer.
2. For each peer it reads that peer's words in its own buffer until every word carries this call's
   epoch.
3. It sums every rank's values in rank order into the tensor. Every rank adds the same values in the
   same order, so all hold the same bits. Then it stores the epoch into its counter.

Each buffer holds two slots, taken in turn: call `e` uses slot `e % 2`. Each slot has a part for each
rank. A peer writes a slot again two calls later. It can do so only after it has read this rank's words
of the call between, which this rank sends after it has read the slot. A word left from an older call
carries an older epoch, and is waited past. Epochs run from 1 to `EPOCHS`, which is even so that the
slots keep their turn; the buffers start zeroed, and no epoch is 0.

One limit, not reached by any graph opgen builds today: a word is written only by calls of at least its
position's length. If a state sums tensors of different lengths, a word past the shorter ones keeps the
epoch of the last longer call. If exactly a multiple of `EPOCHS` (2^30) calls passed before the next
longer one, that word would carry the current epoch, and its old value could be read. Decode's
all-reduces in a group and dtype all have the hidden size, so every call writes every word it reads.
Zeroing each word after reading it would close this; that costs a store a word, and is not measured.

Launched dependently (Hopper and newer, as opgen's generated kernels are), it lets the next kernel start
at once, so that kernel's weight reads overlap this one's wait for its peers. It waits for the kernel
before it first: a chain of such kernels may have started before this one ends, each waiting for the
one before it, so nothing here (the counter included) is read before that wait.
"""

from __future__ import annotations

import triton
import triton.language as tl

EPOCHS = 1 << 30  # the counter wraps here; words carry epochs 1..EPOCHS


@triton.jit
def _words(values, epoch, BITS: tl.constexpr):
    """Each value's BITS bits (16 or 32) in the low half of a uint64, `epoch` (uint32) in the high half."""
    if BITS == 16:
        bits = values.to(tl.uint16, bitcast=True).to(tl.uint64)
    else:
        bits = values.to(tl.uint32, bitcast=True).to(tl.uint64)
    return bits | (epoch.to(tl.uint64) << 32)


@triton.jit
def _values(words, dtype: tl.constexpr, BITS: tl.constexpr):
    """The values of `_words`' words, in `dtype` (of BITS bits)."""
    low = words.to(tl.uint32)
    if BITS == 16:
        values = low.to(tl.uint16).to(dtype, bitcast=True)
    else:
        values = low.to(dtype, bitcast=True)
    return values


@triton.jit
def _arrived(at, ok, epoch):
    """The words at `at` (where `ok`) once every one carries `epoch`: read again (volatile) until they do."""
    words = tl.load(at, mask=ok, other=0, volatile=True)
    pending = ok & ((words >> 32).to(tl.uint32) != epoch)
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        words = tl.where(pending, tl.load(at, mask=pending, other=0, volatile=True), words)
        pending = ok & ((words >> 32).to(tl.uint32) != epoch)
    return words


@triton.jit
def peer_sum_kernel(x, buffers, counter, NUMEL: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
                    SLOT: tl.constexpr, EPOCHS: tl.constexpr, BLOCK: tl.constexpr, BITS: tl.constexpr,
                    DEPENDENT: tl.constexpr):  # fmt: skip
    """x[:NUMEL] = the sum over the group's ranks of their x, in place.

    `buffers`: each rank's mapped buffer (two slots of WORLD parts of SLOT uint64 words), as int64 addresses.
    `counter`: this rank's last epoch (int32, device memory). BITS: the bits of x's dtype (16 or 32).
    DEPENDENT: launched dependently (`passes.dependent_launch`): the next kernel may start at once, and reads
    its weights while this one waits for its peers; this one waits for the kernel before it (which wrote x,
    and after the last call, the counter) before anything else."""
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    epoch = tl.load(counter) % EPOCHS + 1
    sent = epoch.to(tl.uint32)
    slot = (epoch % 2) * WORLD * SLOT
    dtype = x.dtype.element_ty
    offsets = tl.arange(0, BLOCK)
    for start in tl.static_range(0, NUMEL, BLOCK):  # unrolled: every block's stores in flight at once
        at = start + offsets
        words = _words(tl.load(x + at, mask=at < NUMEL, other=0.0), sent, BITS)
        for peer in tl.static_range(WORLD):
            if peer != RANK:
                theirs = tl.load(buffers + peer).to(tl.pointer_type(tl.uint64)) + slot + RANK * SLOT
                tl.store(theirs + at, words, mask=at < NUMEL)
    mine = tl.load(buffers + RANK).to(tl.pointer_type(tl.uint64)) + slot
    for start in tl.static_range(0, NUMEL, BLOCK):
        at = start + offsets
        ok = at < NUMEL
        total = tl.zeros((BLOCK,), tl.float32)
        for rank in tl.static_range(WORLD):
            if rank == RANK:
                total += tl.load(x + at, mask=ok, other=0.0).to(tl.float32)
            else:
                total += _values(_arrived(mine + rank * SLOT + at, ok, sent), dtype, BITS).to(tl.float32)
        tl.store(x + at, total.to(dtype), mask=ok)
    tl.store(counter, epoch % EPOCHS)
