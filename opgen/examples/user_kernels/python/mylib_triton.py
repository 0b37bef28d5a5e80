"""mylib's Triton kernel for the same op as mylib::scaled_add_cuda: self + alpha * other.

`my_ops_cuda.yaml` binds it as `my_ops.kernel_ops.scaled_add_triton`, a candidate for
`mylib.scaled_add.default`: where a graph calls `torch.ops.mylib.scaled_add` on contiguous CUDA tensors
of one shape and is compiled with the `kernel_choice` pass, opgen times this kernel against the CUDA one
on the first call and keeps the faster. The
build copies this file beside the module; opgen imports it the first time the kernel runs.
"""

import triton
import triton.language as tl


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n_elements, alpha, BLOCK: tl.constexpr):
    """out = x + alpha * y over `n_elements` contiguous elements, one BLOCK per program."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)
