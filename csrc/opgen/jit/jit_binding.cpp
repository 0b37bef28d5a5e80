#include "opgen/jit/jit_binding.h"

#include <ATen/ops/empty_like_compositeexplicitautograd_dispatch.h>
#include <c10/util/Exception.h>

namespace opgen::jit {

std::string no_jit_message(const char* op) {
  return std::string("kernel_ops.") + op +
         "(): runs a Triton kernel: it needs opgen built against a CUDA torch, a GPU and triton installed";
}

void require_cuda(const Signature& sig, const at::Tensor& t, int i) {
#ifndef OPGEN_WITH_CUDA
  (void)t;
  (void)i;
  PyErr_SetString(PyExc_RuntimeError, no_jit_message(sig.op()).c_str());
  throw PythonError{};
#else
  if (t.is_cuda()) return;
  raise(PyExc_RuntimeError, sig,
        std::string("argument '") + sig.name(i) + "' is on " + t.device().str() +
            ", but a Triton kernel needs CUDA tensors");
#endif
}

void require_cuda(const Signature& sig, const std::optional<at::Tensor>& t, int i) {
  if (t && t->defined()) require_cuda(sig, *t, i);
}

void require_contiguous(const Signature& sig, const at::Tensor& t, int i) {
  if (t.is_contiguous()) return;
  raise(PyExc_ValueError, sig, std::string("argument '") + sig.name(i) + "' must be contiguous for this Triton kernel");
}

namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t d = 0; d < sizes.size(); ++d) out += (d ? ", " : "") + std::to_string(sizes[d]);
  return out + "]";
}

}  // namespace

void require_same_shape(const Signature& sig, const at::Tensor& a, int i, const at::Tensor& b, int j) {
  if (a.sizes() == b.sizes()) return;
  raise(PyExc_ValueError, sig,
        std::string("arguments '") + sig.name(i) + "' " + shape_text(a.sizes()) + " and '" + sig.name(j) + "' " +
            shape_text(b.sizes()) + " must have the same shape for this Triton kernel (it does not broadcast)");
}

at::Tensor empty_like(const at::Tensor& t) { return at::compositeexplicitautograd::empty_like(t); }

at::Tensor empty_like(const at::Tensor& t, at::ScalarType dtype) {
  return at::compositeexplicitautograd::empty_like(t, t.options().dtype(dtype));
}

}  // namespace opgen::jit
