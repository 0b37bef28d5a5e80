// opgen's own kernels: spec entries name them as `opgen::kernels::<function>` (docs/spec.md). Each
// calls a torch function that no dispatch header declares, directly (no dispatcher on the way).
// The generator checks a spec's kernel against the declarations below (lines starting
// OPGEN_KERNEL, one per line), as it checks ATen kernels against torch's dispatch headers.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <string_view>

#define OPGEN_KERNEL

namespace opgen::kernels {

// oneDNN's fused kernels (torch.ops.mkldnn._linear_pointwise and _convolution_pointwise, default
// and binary overloads): the weight packed by mkldnn._reorder_linear_weight or
// _reorder_convolution_weight (or a plain one), a post-op by name with its scalars. Without oneDNN
// in the torch build they raise RuntimeError.
OPGEN_KERNEL at::Tensor mkldnn_linear_pointwise(const at::Tensor& X, const at::Tensor& W, const std::optional<at::Tensor>& B, std::string_view attr, c10::ArrayRef<double> scalars, std::optional<std::string_view> algorithm);
OPGEN_KERNEL at::Tensor mkldnn_linear_pointwise_binary(const at::Tensor& X, const at::Tensor& other, const at::Tensor& W, const std::optional<at::Tensor>& B, std::string_view attr);
OPGEN_KERNEL at::Tensor mkldnn_convolution_pointwise(const at::Tensor& X, const at::Tensor& W, const std::optional<at::Tensor>& B, c10::IntArrayRef padding, c10::IntArrayRef stride, c10::IntArrayRef dilation, int64_t groups, std::string_view attr, c10::ArrayRef<double> scalars, std::optional<std::string_view> algorithm);
OPGEN_KERNEL at::Tensor mkldnn_convolution_pointwise_binary(const at::Tensor& X, const at::Tensor& other, const at::Tensor& W, const std::optional<at::Tensor>& B, c10::IntArrayRef padding, c10::IntArrayRef stride, c10::IntArrayRef dilation, int64_t groups, std::string_view binary_attr, const std::optional<at::Scalar>& alpha, std::optional<std::string_view> unary_attr, c10::ArrayRef<double> unary_scalars, std::optional<std::string_view> unary_algorithm);

// MKL's packed sgemm (torch.ops.mkl._mkl_linear): X @ ORI_W.T + B with MKL_W the same weight packed
// by mkl._mkl_reorder_linear_weight for batch_size rows; X of another row count takes a plain
// product of ORI_W. Without MKL in the torch build it raises RuntimeError.
OPGEN_KERNEL at::Tensor mkl_linear(const at::Tensor& X, const at::Tensor& MKL_W, const at::Tensor& ORI_W, const std::optional<at::Tensor>& B, int64_t batch_size);

}  // namespace opgen::kernels
