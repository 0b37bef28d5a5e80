// The same kernels as the torch.library op mylib::scaled_add: torch.ops.mylib.scaled_add goes through
// the dispatcher to them, and torch.export traces the op through its Meta kernel. Importing my_ops runs
// these registrations; my_ops.kernel_ops.scaled_add calls the kernels directly.
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/result_type.h>
#include <torch/library.h>

#include "mylib/scaled_add.h"

namespace {

// The result's shape and dtype, no data: what tracing (torch.export, FakeTensor) needs.
at::Tensor scaled_add_meta(const at::Tensor& self, const at::Tensor& other, double /*alpha*/) {
  return at::empty(at::infer_size(self.sizes(), other.sizes()),
                   self.options().dtype(at::result_type(self, other)));
}

}  // namespace

TORCH_LIBRARY(mylib, m) {
  m.def("scaled_add(Tensor self, Tensor other, *, float alpha=1) -> Tensor");
}

TORCH_LIBRARY_IMPL(mylib, CPU, m) {
  m.impl("scaled_add", &mylib::scaled_add);
}

TORCH_LIBRARY_IMPL(mylib, Meta, m) {
  m.impl("scaled_add", &scaled_add_meta);
}

#ifdef MYLIB_WITH_CUDA
TORCH_LIBRARY_IMPL(mylib, CUDA, m) {
  m.impl("scaled_add", &mylib::scaled_add_cuda);
}
#endif
