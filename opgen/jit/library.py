"""Triton kernels that opgen's own ops.yaml names (`kernel: opgen.jit.library:add_kernel`).

This module imports triton at import time (a @triton.jit function needs it), so only the JIT
loader imports it, when a Triton op is first called: never the generator, nor `import opgen`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, alpha, BLOCK: tl.constexpr):
    """out = x + alpha * y over `n_elements` contiguous elements, one BLOCK per program."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)
