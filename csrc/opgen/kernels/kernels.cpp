#include "opgen/kernels/kernels.h"

#include <ATen/Config.h>
#include <ATen/core/List.h>
#include <c10/core/Scalar.h>
#include <c10/util/Exception.h>

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
#if AT_MKL_ENABLED()
Tensor mkl_linear(const Tensor& self, const Tensor& mkl_weight_t, const Tensor& origin_weight_t,
                  const std::optional<Tensor>& bias_opt, const int64_t prepack_batch_size);
#endif
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
#else
[[noreturn]] void no_onednn() { TORCH_CHECK(false, "this torch build has no oneDNN (mkldnn) kernels"); }
#endif

#if !(AT_MKLDNN_ENABLED() && AT_MKL_ENABLED())
[[noreturn]] void no_mkl() { TORCH_CHECK(false, "this torch build has no MKL packed linear (mkl._mkl_linear)"); }
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
  return at::native::mkldnn_convolution_pointwise_binary(X, other, W, B, padding, stride, dilation, groups,
                                                         binary_attr, alpha, unary_attr, scalar_list(unary_scalars),
                                                         unary_algorithm);
#else
  no_onednn();
#endif
}

at::Tensor mkl_linear(const at::Tensor& X, const at::Tensor& MKL_W, const at::Tensor& ORI_W,
                      const std::optional<at::Tensor>& B, int64_t batch_size) {
#if AT_MKLDNN_ENABLED() && AT_MKL_ENABLED()
  return at::native::mkl_linear(X, MKL_W, ORI_W, B, batch_size);
#else
  no_mkl();
#endif
}

}  // namespace opgen::kernels
