// Argument checks a spec entry asks for (`checks:` in ops.yaml; the list is opgen/spec/checks.py).
// Each guards a kernel that trusts its caller: torch's public functions check the same before they
// reach it, but a direct kernel call would read out of bounds instead of raising.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "opgen/binding.h"

namespace opgen::checks {

// Eval-mode batch norm reads weight[c], bias[c], running_mean[c] and running_var[c] for every
// channel c < input.size(1): each defined one must hold that many elements (a ValueError otherwise).
void batch_norm_channels(const Signature& sig, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                         const at::Tensor& running_var);

// The FFT kernels index self's sizes by each of `dim` and assume no dimension comes twice (a
// repeated one reads past the end of their plan): `dim` must be non-empty, in range and distinct.
void fft_dims(const Signature& sig, const at::Tensor& self, const std::vector<int64_t>& dim);

}  // namespace opgen::checks
