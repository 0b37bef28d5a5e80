// The kernels' parameter types where the C++ local an argument is unboxed into differs from what the
// kernel takes. Shared by the bindings (binding.h) and the executor's thunks (thunk.h); no Python.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace opgen {

inline at::OptionalIntArrayRef opt_ref(const std::optional<std::vector<int64_t>>& v) {
  return v ? at::OptionalIntArrayRef(*v) : at::OptionalIntArrayRef();
}
// ATen declares `float[]?` as std::optional<ArrayRef<double>> (upsample_*.vec's scale_factors).
inline std::optional<c10::ArrayRef<double>> opt_ref(const std::optional<std::vector<double>>& v) {
  return v ? std::optional<c10::ArrayRef<double>>(*v) : std::nullopt;
}
inline std::optional<c10::string_view> opt_view(const std::optional<std::string>& v) {
  return v ? std::optional<c10::string_view>(*v) : std::nullopt;
}

}  // namespace opgen
