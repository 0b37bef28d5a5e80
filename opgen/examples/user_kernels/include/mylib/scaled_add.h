#pragma once
// mylib's kernels: plain C++ functions taking ATen's argument types, in schema order. The spec
// (my_ops.yaml) binds them as my_ops.kernel_ops.scaled_add, and src/register.cpp registers them as
// the torch.library op mylib::scaled_add.
#include <ATen/core/Tensor.h>

namespace mylib {

// self + alpha * other, broadcast and type-promoted as torch.add does (the CPU kernel; any device).
at::Tensor scaled_add(const at::Tensor& self, const at::Tensor& other, double alpha);

// The same on the GPU by a kernel of our own (src/scaled_add_cuda.cu, built only where CUDA is):
// float, half or bfloat16 tensors of one dtype and one shape, contiguous, on one CUDA device.
at::Tensor scaled_add_cuda(const at::Tensor& self, const at::Tensor& other, double alpha);

}  // namespace mylib
