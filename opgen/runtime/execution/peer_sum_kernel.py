"""The Triton kernel of opgen's one-shot all-reduce over peer memory (`execution.peer_sum`).

This module imports triton at import time (a @triton.jit function needs it): only `execution.peer_sum`
imports it, when a graph with such an all-reduce is bound.

Each program sums BLOCK elements of a small tensor over the ranks of a group, in place, on its own: the
programs of a call share nothing (each keeps its own epoch), so a message spreads over several SMs. Each
value travels with the call's epoch in one 8-byte word: the value's bits in the low half, the epoch in
the high half. A GPU stores an aligned 8-byte word whole, so a word that carries this call's epoch
carries this call's value. NCCL's low-latency protocol (LL) works the same way. There are no flags,
fences or barriers: a peer's value can be read as soon as it lands.

1. A program sends each of its values, as a word with this call's epoch, into its place in every
   peer's mapped buffer.
2. For each peer it reads that peer's words in its own buffer until every word carries this call's
   epoch, then zeroes them.
3. It sums every rank's values in rank order into the tensor. Every rank adds the same values in the
   same order, so all hold the same bits. Then it stores the epoch into its counter.

Everything below holds for each program index on its own: program p of a call talks only to the peers'
programs p, about block p.

Each buffer holds two slots, taken in turn: call `e` uses slot `e % 2`. Each slot has a part for each
rank. A peer writes a slot again two calls later. It can do so only after it has read this rank's words
of the call between, which this rank sends after it has read the slot. A word left from an older call
carries an older epoch, and is waited past. Epochs run from 1 to `epoch_words.EPOCHS`, which is even so that the
slots keep their turn; the buffers start zeroed, and no epoch is 0.

Each word is zeroed once read, so a word never read again carries no epoch: a state that sums tensors of
different lengths reads past the shorter ones only words of this call or zeros.

Launched dependently (Hopper and newer, as opgen's generated kernels are), it lets the next kernel start
at once, so that kernel's weight reads overlap this one's wait for its peers. It waits for the kernel
before it first: a chain of such kernels may have started before this one ends, each waiting for the
one before it, so nothing here (the counters included) is read before that wait.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opgen.runtime.execution.epoch_words import arrived, this_call


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
def peer_sum_kernel(x, buffers, counters, NUMEL: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
                    SLOT: tl.constexpr, EPOCHS: tl.constexpr, BLOCK: tl.constexpr, BITS: tl.constexpr,
                    DEPENDENT: tl.constexpr, TIMEOUT_NS: tl.constexpr):  # fmt: skip
    """x[:NUMEL] = the sum over the group's ranks of their x, in place, BLOCK elements a program.

    `buffers`: each rank's mapped buffer (two slots of WORLD parts of SLOT uint64 words), as int64 addresses.
    `counters`: this rank's last epoch for each program (int32, device memory): program p sends, reads and
    counts only block p, so its epochs, slots and peers' programs p are its own. BITS: the bits of x's
    dtype (16 or 32). DEPENDENT: launched dependently (`passes.dependent_launch`): the next kernel may start
    at once, and reads its weights while this one waits for its peers; this one waits for the kernel before
    it (which wrote x, and after the last call, the counters) before anything else. TIMEOUT_NS: how long it
    waits for a peer's words before it stops (`epoch_words.arrived`; 0: for ever)."""
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    block = tl.program_id(0)
    epoch, sent, slot = this_call(counters, block, EPOCHS, WORLD, SLOT)
    dtype = x.dtype.element_ty
    at = block * BLOCK + tl.arange(0, BLOCK)
    ok = at < NUMEL
    own = tl.load(x + at, mask=ok, other=0.0)
    words = _words(own, sent, BITS)
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            theirs = tl.load(buffers + peer).to(tl.pointer_type(tl.uint64)) + slot + RANK * SLOT
            tl.store(theirs + at, words, mask=ok)
    mine = tl.load(buffers + RANK).to(tl.pointer_type(tl.uint64)) + slot
    total = tl.zeros((BLOCK,), tl.float32)
    for rank in tl.static_range(WORLD):
        if rank == RANK:
            total += own.to(tl.float32)
        else:
            total += _values(arrived(mine + rank * SLOT + at, ok, sent, TIMEOUT_NS), dtype, BITS).to(tl.float32)
            tl.store(mine + rank * SLOT + at, tl.zeros((BLOCK,), tl.uint64), mask=ok)  # read: no epoch's again
    tl.store(x + at, total.to(dtype), mask=ok)
    tl.store(counters + block, epoch % EPOCHS)
