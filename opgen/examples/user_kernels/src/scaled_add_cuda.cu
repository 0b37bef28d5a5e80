// mylib::scaled_add_cuda: self + alpha * other by an elementwise kernel of our own, launched on the
// current stream. It takes what it is written for and refuses the rest with an error naming it.
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "mylib/scaled_add.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // a grid-stride loop covers any size

template <typename scalar_t>
__global__ void scaled_add_kernel(const scalar_t* __restrict__ self, const scalar_t* __restrict__ other,
                                  scalar_t* __restrict__ out, at::opmath_type<scalar_t> alpha, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;  // float for half and bfloat16
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<scalar_t>(static_cast<acc_t>(self[i]) + alpha * static_cast<acc_t>(other[i]));
  }
}

template <typename scalar_t>
void launch(const at::Tensor& self, const at::Tensor& other, const at::Tensor& out, double alpha) {
  const int64_t n = self.numel();
  const auto blocks = static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
  scaled_add_kernel<scalar_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      self.const_data_ptr<scalar_t>(), other.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
      static_cast<at::opmath_type<scalar_t>>(alpha), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

namespace mylib {

at::Tensor scaled_add_cuda(const at::Tensor& self, const at::Tensor& other, double alpha) {
  TORCH_CHECK(self.is_cuda() && other.is_cuda(), "mylib::scaled_add_cuda: expected CUDA tensors, got ",
              self.device(), " and ", other.device());
  TORCH_CHECK(self.device() == other.device(), "mylib::scaled_add_cuda: expected tensors on one device, got ",
              self.device(), " and ", other.device());
  TORCH_CHECK(self.scalar_type() == other.scalar_type(), "mylib::scaled_add_cuda: expected tensors of one dtype, got ",
              self.scalar_type(), " and ", other.scalar_type());
  TORCH_CHECK(self.sizes() == other.sizes(), "mylib::scaled_add_cuda: expected tensors of one shape (no ",
              "broadcasting), got ", self.sizes(), " and ", other.sizes());
  TORCH_CHECK(self.is_contiguous() && other.is_contiguous(), "mylib::scaled_add_cuda: expected contiguous tensors");

  const c10::cuda::CUDAGuard guard(self.device());
  at::Tensor out = at::empty(self.sizes(), self.options());
  if (out.numel() == 0) {
    return out;
  }
  switch (self.scalar_type()) {
    case at::kFloat:
      launch<float>(self, other, out, alpha);
      break;
    case at::kHalf:
      launch<at::Half>(self, other, out, alpha);
      break;
    case at::kBFloat16:
      launch<at::BFloat16>(self, other, out, alpha);
      break;
    default:
      TORCH_CHECK(false, "mylib::scaled_add_cuda: expected float, half or bfloat16 tensors, got ",
                  self.scalar_type());
  }
  return out;
}

}  // namespace mylib
