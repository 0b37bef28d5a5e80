"""The Triton kernels of `opgen.bench.chain`: a product's tile, the gated pair's, one launch a product,
and the persistent kernel of the whole chain. Imported once the bench knows whether to interpret."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _wait(WAIT: tl.constexpr, counters, stage, P: tl.constexpr, first):
    """After a tile's first weights are read, before its input is: WAIT 1 waits for the kernel before
    (dependent launch), WAIT 2 for all P programs to have passed `stage` (a persistent program's first
    tile of a product; stage -1: nothing before)."""
    if WAIT == 1:
        tl.extra.cuda.gdc_wait()
    if WAIT == 2:
        if first & (stage >= 0):
            seen = tl.load(counters + stage, volatile=True)  # plain reads while spinning: no traffic on the
            while seen < P:  # counter's line beyond them, which the arrivals need
                seen = tl.load(counters + stage, volatile=True)
            tl.atomic_add(counters + stage, 0, sem="acquire", scope="gpu")  # orders the reads after it
            tl.debug_barrier()


@triton.jit
def _product(w, x, y, t, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             WAIT: tl.constexpr, counters, stage, P: tl.constexpr, first):  # fmt: skip
    """y[rows] = w[rows, :] @ x for tile t's BLOCK_N rows, float32 sums; `_wait` after the first weights
    are read."""
    rows = t * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ks = tl.arange(0, BLOCK_K)
    tile = tl.load(w + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0,
                   eviction_policy="evict_first")  # fmt: skip
    _wait(WAIT, counters, stage, P, first)
    xs = tl.load(x + ks, mask=ks < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    acc = tl.sum(tile.to(tl.float32) * xs[None, :], axis=1)
    for start in range(BLOCK_K, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        tile = tl.load(w + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0,
                       eviction_policy="evict_first")  # fmt: skip
        xs = tl.load(x + ks, mask=ks < K, other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += tl.sum(tile.to(tl.float32) * xs[None, :], axis=1)
    tl.store(y + rows, acc.to(y.dtype.element_ty), mask=row_ok)


@triton.jit
def _swiglu(gate, up, y):
    """silu(gate) * up in y's dtype from float32 sums, each product and the silu rounded to it as opgen's
    gated kernels store them."""
    dtype = y.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def _gated(wg, wu, x, y, t, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           WAIT: tl.constexpr, counters, stage, P: tl.constexpr, first):  # fmt: skip
    """y[rows] = silu(wg[rows] @ x) * (wu[rows] @ x), each product and the silu rounded to y's dtype."""
    rows = t * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ks = tl.arange(0, BLOCK_K)
    ok = row_ok[:, None] & (ks < K)[None, :]
    g = tl.load(wg + rows[:, None] * K + ks[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
    u = tl.load(wu + rows[:, None] * K + ks[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
    _wait(WAIT, counters, stage, P, first)
    xs = tl.load(x + ks, mask=ks < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    acc_g = tl.sum(g.to(tl.float32) * xs[None, :], axis=1)
    acc_u = tl.sum(u.to(tl.float32) * xs[None, :], axis=1)
    for start in range(BLOCK_K, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (ks < K)[None, :]
        g = tl.load(wg + rows[:, None] * K + ks[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
        u = tl.load(wu + rows[:, None] * K + ks[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
        xs = tl.load(x + ks, mask=ks < K, other=0.0, cache_modifier=".cg").to(tl.float32)
        acc_g += tl.sum(g.to(tl.float32) * xs[None, :], axis=1)
        acc_u += tl.sum(u.to(tl.float32) * xs[None, :], axis=1)
    tl.store(y + rows, _swiglu(acc_g, acc_u, y), mask=row_ok)


@triton.jit
def product_kernel(w, x, y, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   DEPENDENT: tl.constexpr):  # fmt: skip
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
    _product(w, x, y, tl.program_id(0), N, K, BLOCK_N, BLOCK_K, DEPENDENT, w, -1, 1, False)


@triton.jit
def gated_kernel(wg, wu, x, y, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DEPENDENT: tl.constexpr):  # fmt: skip
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
    _gated(wg, wu, x, y, tl.program_id(0), N, K, BLOCK_N, BLOCK_K, DEPENDENT, wg, -1, 1, False)


@triton.jit
def _arrive(counters, stage):
    """This program's stores so far are visible to any program that sees its bump of `stage`."""
    tl.debug_barrier()  # the program's threads have stored
    tl.atomic_add(counters + stage, 1, sem="release", scope="gpu")


@triton.jit
def persistent_kernel(w_qkv, w_o, w_g, w_u, w_d, h, qkv, o, gu, counters, LAYERS: tl.constexpr,
                      HID: tl.constexpr, QKV: tl.constexpr, INTER: tl.constexpr, P: tl.constexpr,
                      BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_KD: tl.constexpr):  # fmt: skip
    """The whole chain: program p takes tiles p, p + P, ... of each product; its first tile of a product
    waits (after reading its first weights) for every program to have finished the product before."""
    pid = tl.program_id(0)
    for layer in range(LAYERS):
        s = layer * 4
        for i in range(tl.cdiv(tl.cdiv(QKV, BN_QKV), P)):
            if pid + i * P < tl.cdiv(QKV, BN_QKV):
                _product(w_qkv + layer * QKV * HID, h, qkv, pid + i * P, QKV, HID, BN_QKV, BLOCK_K, 2, counters,
                         s - 1, P, i == 0)  # fmt: skip
        _arrive(counters, s)
        for i in range(tl.cdiv(tl.cdiv(HID, BN_O), P)):
            if pid + i * P < tl.cdiv(HID, BN_O):
                _product(w_o + layer * HID * HID, qkv, o, pid + i * P, HID, HID, BN_O, BLOCK_K, 2, counters, s, P,
                         i == 0)  # fmt: skip
        _arrive(counters, s + 1)
        for i in range(tl.cdiv(tl.cdiv(INTER, BN_GU), P)):
            if pid + i * P < tl.cdiv(INTER, BN_GU):
                _gated(w_g + layer * INTER * HID, w_u + layer * INTER * HID, o, gu, pid + i * P, INTER, HID, BN_GU,
                       BLOCK_K, 2, counters, s + 1, P, i == 0)  # fmt: skip
        _arrive(counters, s + 2)
        for i in range(tl.cdiv(tl.cdiv(HID, BN_D), P)):
            if pid + i * P < tl.cdiv(HID, BN_D):
                _product(w_d + layer * HID * INTER, gu, h, pid + i * P, HID, INTER, BN_D, BLOCK_KD, 2, counters,
                         s + 2, P, i == 0)  # fmt: skip
        _arrive(counters, s + 3)


# A few rows (batched decode): x is [M, K] (rows SX apart), y [M, N]. DOT: a [BLOCK_M, BLOCK_K] block of
# the rows times a [BLOCK_K, BLOCK_N] tile of the weight on tensor cores (BLOCK_M >= 16, the rows padded),
# as opgen's few-row kernels do; else every row times every weight row on the FMA units, the products
# summed along K at the end (BLOCK_M = the rows), as opgen's one-row kernels do.


@triton.jit
def _rows_acc(acc, w, x, cols, ms, ks, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr,
              DOT: tl.constexpr, WAIT: tl.constexpr):  # fmt: skip
    k_ok = ks < K
    m_ok = ms < M
    if DOT:
        tile = tl.load(w + cols[None, :] * K + ks[:, None], mask=k_ok[:, None] & (cols < N)[None, :], other=0.0,
                       eviction_policy="evict_first")  # fmt: skip
        if WAIT:
            tl.extra.cuda.gdc_wait()
        xs = tl.load(x + ms[:, None] * SX + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0,
                     cache_modifier=".cg")  # fmt: skip
        acc = tl.dot(xs, tile, acc)
    else:
        tile = tl.load(w + cols[:, None] * K + ks[None, :], mask=(cols < N)[:, None] & k_ok[None, :], other=0.0,
                       eviction_policy="evict_first")  # fmt: skip
        if WAIT:
            tl.extra.cuda.gdc_wait()
        xs = tl.load(x + ms[:, None] * SX + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0,
                     cache_modifier=".cg")  # fmt: skip
        acc += xs.to(tl.float32)[:, None, :] * tile.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _rows_sum(w, x, t, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, DEPENDENT: tl.constexpr):  # fmt: skip
    """x @ w[cols].T for tile t's BLOCK_N columns: [BLOCK_M, BLOCK_N] float32."""
    cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    if DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
    acc = _rows_acc(acc, w, x, cols, ms, tl.arange(0, BLOCK_K), M, N, K, SX, DOT, DEPENDENT)
    for start in range(BLOCK_K, K, BLOCK_K):
        acc = _rows_acc(acc, w, x, cols, ms, start + tl.arange(0, BLOCK_K), M, N, K, SX, DOT, False)
    if DOT:
        return acc
    else:
        return tl.sum(acc, axis=2)


@triton.jit
def rows_product_kernel(w, x, y, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
                        DEPENDENT: tl.constexpr):  # fmt: skip
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    acc = _rows_sum(w, x, t, M, N, K, SX, BLOCK_M, BLOCK_N, BLOCK_K, DOT, DEPENDENT)
    cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    ok = (ms < M)[:, None] & (cols < N)[None, :]
    tl.store(y + ms[:, None] * N + cols[None, :], acc.to(y.dtype.element_ty), mask=ok)


@triton.jit
def rows_gated_kernel(wg, wu, x, y, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SX: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
                      DEPENDENT: tl.constexpr):  # fmt: skip
    """silu(x @ wg[cols].T) * (x @ wu[cols].T), both products in one walk of K."""
    if DEPENDENT:
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    if DOT:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
    ks = tl.arange(0, BLOCK_K)
    acc_g = _rows_acc(acc_g, wg, x, cols, ms, ks, M, N, K, SX, DOT, DEPENDENT)  # gate's first tile, the wait
    acc_u = _rows_acc(acc_u, wu, x, cols, ms, ks, M, N, K, SX, DOT, False)
    for start in range(BLOCK_K, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        acc_g = _rows_acc(acc_g, wg, x, cols, ms, ks, M, N, K, SX, DOT, False)
        acc_u = _rows_acc(acc_u, wu, x, cols, ms, ks, M, N, K, SX, DOT, False)
    if DOT:
        gated = _swiglu(acc_g, acc_u, y)
    else:
        gated = _swiglu(tl.sum(acc_g, axis=2), tl.sum(acc_u, axis=2), y)
    tl.store(y + ms[:, None] * N + cols[None, :], gated, mask=(ms < M)[:, None] & (cols < N)[None, :])
