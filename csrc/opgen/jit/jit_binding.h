// What generated bindings of Triton ops (ops.yaml entries with `triton:`) call besides
// jit.h: the checks of their tensor arguments, output allocation, and the conversion of
// schema values into kernel arguments. Compiled in every build; the launch itself lives in
// jit_launcher.cpp (CUDA builds) or jit_stub.cpp (CPU builds).
#pragma once

#include "opgen/bind/binding.h"
#include "opgen/jit/jit.h"
#include "opgen/kernels/int_ops.h"

#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace opgen::jit {

// The RuntimeError text of a Triton op called where there is no launcher (a CPU build of opgen).
std::string no_jit_message(const char* op);

// A Triton kernel reads raw device pointers: each tensor argument must be a CUDA tensor (a CPU
// tensor, even a 0-dim one, is refused naming the argument). In a CPU build, any tensor is refused
// with no_jit_message. An absent optional tensor passes.
void require_cuda(const Signature& sig, const at::Tensor& t, int i);
void require_cuda(const Signature& sig, const std::optional<at::Tensor>& t, int i);
// The spec's `contiguous:` and `same_shape:` requirements (ValueError naming the arguments).
void require_contiguous(const Signature& sig, const at::Tensor& t, int i);
void require_same_shape(const Signature& sig, const at::Tensor& a, int i, const at::Tensor& b, int j);

// Outputs (`empty_like(t)`, `empty_like(t, dtype=...)`): the layout of `t`, on its device.
at::Tensor empty_like(const at::Tensor& t);
at::Tensor empty_like(const at::Tensor& t, at::ScalarType dtype);

// Python's `//` on int64, for argument expressions and the launcher's grid programs (int_ops.h).
using opgen::floordiv;

// Schema values as kernel arguments: a Scalar goes as a float (its value as a double); an absent
// optional as None.
inline Arg scalar_arg(const at::Scalar& s) { return float_arg(s.toDouble()); }
inline Arg scalar_arg(const std::optional<at::Scalar>& s) { return s ? scalar_arg(*s) : none_arg(); }
inline Arg tensor_arg(const std::optional<at::Tensor>& t) { return t ? tensor_arg(*t) : none_arg(); }
inline Arg int_arg(const std::optional<int64_t>& v) { return v ? int_arg(*v) : none_arg(); }
inline Arg float_arg(const std::optional<double>& v) { return v ? float_arg(*v) : none_arg(); }
inline Arg bool_arg(const std::optional<bool>& v) { return v ? bool_arg(*v) : none_arg(); }

}  // namespace opgen::jit
