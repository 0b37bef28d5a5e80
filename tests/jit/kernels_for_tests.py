"""Triton kernels the JIT tests launch (importable by module:qualname, as the cache needs)."""

import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)


@triton.jit
def scale_inplace_kernel(x_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


@triton.jit
def add_2d_kernel(x_ptr, out_ptr, rows, cols, stride_row, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (r < rows) & (c < cols)
    v = tl.load(x_ptr + r * stride_row + c, mask=mask)
    tl.store(out_ptr + r * cols + c, v + r + c * 1000, mask=mask)


@triton.jit
def grid3_kernel(out_ptr, A: tl.constexpr, B: tl.constexpr):
    x = tl.program_id(0)
    y = tl.program_id(1)
    z = tl.program_id(2)
    tl.store(out_ptr + (z * B + y) * A + x, x + 10 * y + 100 * z)


@triton.jit
def accumulate_kernel(acc_ptr, x_ptr, n, BLOCK: tl.constexpr):
    """acc += x: read-modify-write, so running it twice on the same buffer would show."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(acc_ptr + offs, tl.load(acc_ptr + offs, mask=mask) + tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def int_kernel(out_ptr, n, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs * k, mask=offs < n)


@triton.autotune(
    configs=[triton.Config({"BLOCK": 128}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"]
)
@triton.jit
def tuned_mul_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


@triton.jit
def rows_dot_kernel(x_ptr, w_ptr, out_ptr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[:, cols] = x @ w[cols, :].T for 16 rows of x: a pipelined loop of dots, whose shared memory grows
    with BLOCK_K and num_stages."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, 16)
    acc = tl.zeros((16, BLOCK_N), tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        xs = tl.load(x_ptr + ms[:, None] * K + ks[None, :])
        tile = tl.load(w_ptr + cols[None, :] * K + ks[:, None])
        acc = tl.dot(xs, tile, acc)
    tl.store(out_ptr + ms[:, None] * (BLOCK_N * tl.num_programs(0)) + cols[None, :], acc)
