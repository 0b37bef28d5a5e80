#include "opgen/checks.h"

#include <string>

namespace opgen::checks {

namespace {

// `name` is the schema argument's: spec/checks.py makes the spec pass arguments of these names.
void channels(const Signature& sig, const char* name, const at::Tensor& t, int64_t expected) {
  if (t.numel() == expected) return;
  raise(PyExc_ValueError, sig,
        std::string("argument '") + name + "' must hold input.size(1) = " + std::to_string(expected) +
            " elements, not " + std::to_string(t.numel()));
}

}  // namespace

void batch_norm_channels(const Signature& sig, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                         const at::Tensor& running_var) {
  if (input.dim() < 2) return;  // the kernel's own error names the missing dimension
  const int64_t c = input.size(1);
  if (weight.has_value() && weight->defined()) channels(sig, "weight", *weight, c);
  if (bias.has_value() && bias->defined()) channels(sig, "bias", *bias, c);
  channels(sig, "running_mean", running_mean, c);
  channels(sig, "running_var", running_var, c);
}

void fft_dims(const Signature& sig, const at::Tensor& self, const std::vector<int64_t>& dim) {
  const int64_t rank = self.dim();
  if (dim.empty()) raise(PyExc_ValueError, sig, "argument 'dim' must name at least one dimension");
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (const int64_t d : dim) {
    if (d < -rank || d >= rank) {
      raise(PyExc_IndexError, sig,
            "argument 'dim': dimension " + std::to_string(d) + " is out of range for a tensor of " +
                std::to_string(rank) + " dimensions");
    }
    const auto wrapped = static_cast<size_t>(d < 0 ? d + rank : d);
    if (seen[wrapped]) {
      raise(PyExc_ValueError, sig, "argument 'dim' names dimension " + std::to_string(wrapped) + " twice");
    }
    seen[wrapped] = true;
  }
}

}  // namespace opgen::checks
