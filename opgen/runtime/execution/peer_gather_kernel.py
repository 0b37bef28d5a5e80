"""The Triton kernel of opgen's one-shot all-gather over peer memory (`execution.peer_gather`).

This module imports triton at import time (a @triton.jit function needs it): only `execution.peer_gather`
imports it, when a graph with such an all-gather is bound.

`out[r * NUMEL:(r + 1) * NUMEL]` = rank r's `x`, for every rank r of the group (`all_gather_into_tensor`).
Each program takes BLOCK elements of `x` and shares nothing with the others: it has its own epoch
counter (`counters[pid]`) and its own words of each slot, and pairs with the same program of every peer.
Its values travel as 8-byte words carrying the call's epoch (`execution.epoch_words`), 32 bits of values
a word: two values of a 16-bit dtype (the first in the low half), or one float32. A 16-bit value alone
in a word would send four times its size; two to a word send twice.

1. The program packs its values into words with this call's epoch and stores them into its place in
   every peer's mapped buffer (the slot of this call, the part of this rank).
2. It copies its own values into this rank's part of `out`.
3. For each peer it reads that peer's words in its own buffer until every word carries this call's
   epoch, stores zero over them (so no word left behind can ever carry a later call's epoch, whatever
   the lengths of the calls a state serves), and copies the values into that peer's part of `out`.
   Then it stores the epoch into its counter.

Each buffer holds two slots, taken in turn: call `e` uses slot `e % 2`. A peer's program writes a slot
again two calls later, only after it has read this rank's words of the call between, which this rank's
program sends after it has read (and zeroed) the slot in an earlier launch. Words left from older calls
carry an older epoch, or zero, and are waited past.

Launched dependently (Hopper and newer, as opgen's generated kernels are), it lets the next kernel start
at once and waits for the kernel before it before it reads anything, its counters included (as
`peer_sum_kernel` does).
"""

from __future__ import annotations

import triton
import triton.language as tl

from opgen.runtime.execution.epoch_words import arrived, this_call


@triton.jit
def _places(word, PACK: tl.constexpr):
    """The elements of the words `word`: [words, 2] for PACK 2 (a word's two values side by side), the
    words themselves for PACK 1."""
    if PACK == 2:
        at = word[:, None] * 2 + tl.arange(0, 2)[None, :]
    else:
        at = word
    return at


@triton.jit
def _words(values, epoch, PACK: tl.constexpr):
    """`_places`' values as uint64 words: 32 bits of values in the low half (a pair of 16-bit values, the
    first lowest, or one 32-bit value), `epoch` (uint32) in the high half."""
    if PACK == 2:
        low, high = tl.split(values.to(tl.uint16, bitcast=True).to(tl.uint32))
        bits = low | (high << 16)
    else:
        bits = values.to(tl.uint32, bitcast=True)
    return bits.to(tl.uint64) | (epoch.to(tl.uint64) << 32)


@triton.jit
def _values(words, dtype: tl.constexpr, PACK: tl.constexpr):
    """The values of `_words`' words, in `dtype`, shaped as `_places`."""
    bits = words.to(tl.uint32)
    if PACK == 2:
        values = tl.join((bits & 0xFFFF).to(tl.uint16), (bits >> 16).to(tl.uint16)).to(dtype, bitcast=True)
    else:
        values = bits.to(dtype, bitcast=True)
    return values


@triton.jit
def _words_at(buffers, rank, part, word):
    """Pointers to the words `word` of the part at `part` (in words) of `rank`'s buffer. The buffer is
    16-byte aligned and parts and programs start at even words (`execution.peer_gather`), so each thread's
    pair of words is one 16-byte store or load."""
    return tl.multiple_of(tl.load(buffers + rank).to(tl.pointer_type(tl.uint64)) + part + word, 16)


@triton.jit
def peer_gather_kernel(x, out, buffers, counters, NUMEL: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
                       SLOT: tl.constexpr, EPOCHS: tl.constexpr, BLOCK: tl.constexpr, PACK: tl.constexpr,
                       DEPENDENT: tl.constexpr, TIMEOUT_NS: tl.constexpr):  # fmt: skip
    """out[RANK * NUMEL + i] = x[i]; out[peer * NUMEL + i] = the peer's x[i]. One program a BLOCK of x.

    `buffers`: each rank's mapped buffer (two slots of WORLD parts of SLOT uint64 words, SLOT at least
    NUMEL / PACK rounded up), as int64 addresses. `counters`: this rank's last epoch of each program (int32,
    device memory). PACK: values a word, 2 for a 16-bit dtype, 1 for float32 (passed, not read from x's
    dtype). DEPENDENT: launched dependently (`passes.dependent_launch`): the next kernel may start at once;
    this one waits for the kernel before it (which wrote x, and after the last call, the counters) first.
    TIMEOUT_NS: how long it waits for a peer's words before it stops (`epoch_words.arrived`; 0: for ever)."""
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    epoch, sent, slot = this_call(counters, pid, EPOCHS, WORLD, SLOT)
    word = pid * (BLOCK // PACK) + tl.arange(0, BLOCK // PACK)  # this program's words
    full = word < (NUMEL + PACK - 1) // PACK  # a word holding at least one element
    at = _places(word, PACK)  # and their elements
    ok = at < NUMEL
    values = tl.load(x + at, mask=ok, other=0.0)
    words = _words(values, sent, PACK)
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            tl.store(_words_at(buffers, peer, slot + RANK * SLOT, word), words, mask=full)
    tl.store(out + RANK * NUMEL + at, values, mask=ok)
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            landed = _words_at(buffers, RANK, slot + peer * SLOT, word)
            got = arrived(landed, full, sent, TIMEOUT_NS)
            tl.store(landed, tl.zeros_like(got), mask=full)
            tl.store(out + peer * NUMEL + at, _values(got, out.dtype.element_ty, PACK), mask=ok)
    tl.store(counters + pid, epoch % EPOCHS)
