#include "opgen/kernels.h"

#include <ATen/Config.h>
#include <ATen/core/List.h>
#include <c10/core/Scalar.h>
#include <c10/util/Exception.h>

#include <vector>

#if AT_MKLDNN_ENABLED()
// torch's CPU wheels export these (libtorch_cpu.so) but install no header for them
// (ATen/native/mkldnn/*.h): the prototypes are copied from aten/src/ATen/native/mkldnn/Linear.cpp
// and Conv.cpp, and a mismatch fails at load time (an undefined symbol), never silently.
namespace at::native {
Tensor mkldnn_linear_pointwise(const Tensor& input_t, const Tensor& weight_t, const std::optional<Tensor>& bias_opt,
                               std::string_view attr, c10::List<std::optional<at::Scalar>> scalars,
                               std::optional<std::string_view> algorithm);
Tensor mkldnn_linear_pointwise_binary(const Tensor& input_t, const Tensor& other_t, const Tensor& weight_t,
                                      const std::optional<Tensor>& bias_opt, std::string_view attr);
Tensor mkldnn_convolution_pointwise(const Tensor& input_t, const Tensor& weight_t, const std::optional<Tensor>& bias_opt,
                                    IntArrayRef padding, IntArrayRef stride, IntArrayRef dilation, int64_t groups,
                                    std::string_view attr, c10::List<std::optional<at::Scalar>> scalars,
                                    std::optional<std::string_view> algorithm);
Tensor mkldnn_convolution_pointwise_binary(const Tensor& input_t, const Tensor& other_t, const Tensor& weight_t,
                                           const std::optional<Tensor>& bias_opt, IntArrayRef padding,
                                           IntArrayRef stride, IntArrayRef dilation, int64_t groups,
                                           std::string_view binary_attr, std::optional<at::Scalar> alpha,
                                           std::optional<std::string_view> unary_attr,
                                           c10::List<std::optional<at::Scalar>> unary_scalars,
                                           std::optional<std::string_view> unary_algorithm);
}  // namespace at::native
#endif

namespace opgen::kernels {

namespace {

#if AT_MKLDNN_ENABLED()
c10::List<std::optional<at::Scalar>> scalar_list(c10::ArrayRef<double> values) {
  c10::List<std::optional<at::Scalar>> list;
  list.reserve(values.size());
  for (double v : values) list.push_back(at::Scalar(v));
  return list;
}
// The binary post-op reads `other` as a dense tensor of the result's shape and trusts it (a smaller
// one is read past its end, torch.ops.mkldnn too): check it first.
void check_other(const at::Tensor& other, c10::IntArrayRef result) {
  TORCH_CHECK_VALUE(other.sizes() == result, "argument 'other' must have the result's shape ", result, ", not ",
                    other.sizes());
  TORCH_CHECK_VALUE(other.is_non_overlapping_and_dense(), "argument 'other' must be dense (contiguous or channels-last)");
}

std::vector<int64_t> linear_result(const at::Tensor& X, const at::Tensor& W) {
  TORCH_CHECK_VALUE(X.dim() >= 1 && W.dim() == 2, "X must have a dimension and W two");
  std::vector<int64_t> sizes(X.sizes().begin(), X.sizes().end());
  sizes.back() = W.size(0);
  return sizes;
}

std::vector<int64_t> conv_result(const at::Tensor& X, const at::Tensor& W, c10::IntArrayRef padding,
                                 c10::IntArrayRef stride, c10::IntArrayRef dilation) {
  const size_t spatial = X.dim() > 2 ? static_cast<size_t>(X.dim() - 2) : 0;
  TORCH_CHECK_VALUE(spatial > 0 && W.dim() == X.dim() && padding.size() == spatial && stride.size() == spatial &&
                        dilation.size() == spatial,
                    "X and W need the same number (3 or more) of dimensions, and padding, stride and dilation one "
                    "entry per spatial dimension");
  std::vector<int64_t> sizes{X.size(0), W.size(0)};
  for (size_t d = 0; d < spatial; ++d) {
    TORCH_CHECK_VALUE(stride[d] > 0 && dilation[d] > 0, "stride and dilation must be positive");
    const int64_t extent = dilation[d] * (W.size(d + 2) - 1) + 1;
    sizes.push_back((X.size(d + 2) + 2 * padding[d] - extent) / stride[d] + 1);
  }
  return sizes;
}
#else
[[noreturn]] void no_onednn() { TORCH_CHECK(false, "this torch build has no oneDNN (mkldnn) kernels"); }
#endif

}  // namespace

at::Tensor mkldnn_linear_pointwise(const at::Tensor& X, const at::Tensor& W, const std::optional<at::Tensor>& B,
                                   std::string_view attr, c10::ArrayRef<double> scalars,
                                   std::optional<std::string_view> algorithm) {
#if AT_MKLDNN_ENABLED()
  return at::native::mkldnn_linear_pointwise(X, W, B, attr, scalar_list(scalars), algorithm);
#else
  no_onednn();
#endif
}

at::Tensor mkldnn_linear_pointwise_binary(const at::Tensor& X, const at::Tensor& other, const at::Tensor& W,
                                          const std::optional<at::Tensor>& B, std::string_view attr) {
#if AT_MKLDNN_ENABLED()
  check_other(other, linear_result(X, W));
  return at::native::mkldnn_linear_pointwise_binary(X, other, W, B, attr);
#else
  no_onednn();
#endif
}

at::Tensor mkldnn_convolution_pointwise(const at::Tensor& X, const at::Tensor& W, const std::optional<at::Tensor>& B,
                                        c10::IntArrayRef padding, c10::IntArrayRef stride, c10::IntArrayRef dilation,
                                        int64_t groups, std::string_view attr, c10::ArrayRef<double> scalars,
                                        std::optional<std::string_view> algorithm) {
#if AT_MKLDNN_ENABLED()
  return at::native::mkldnn_convolution_pointwise(X, W, B, padding, stride, dilation, groups, attr,
                                                  scalar_list(scalars), algorithm);
#else
  no_onednn();
#endif
}

at::Tensor mkldnn_convolution_pointwise_binary(const at::Tensor& X, const at::Tensor& other, const at::Tensor& W,
                                               const std::optional<at::Tensor>& B, c10::IntArrayRef padding,
                                               c10::IntArrayRef stride, c10::IntArrayRef dilation, int64_t groups,
                                               std::string_view binary_attr, const std::optional<at::Scalar>& alpha,
                                               std::optional<std::string_view> unary_attr,
                                               c10::ArrayRef<double> unary_scalars,
                                               std::optional<std::string_view> unary_algorithm) {
#if AT_MKLDNN_ENABLED()
  check_other(other, conv_result(X, W, padding, stride, dilation));
  return at::native::mkldnn_convolution_pointwise_binary(X, other, W, B, padding, stride, dilation, groups,
                                                         binary_attr, alpha, unary_attr, scalar_list(unary_scalars),
                                                         unary_algorithm);
#else
  no_onednn();
#endif
}

}  // namespace opgen::kernels
