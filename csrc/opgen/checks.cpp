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

}  // namespace opgen::checks
