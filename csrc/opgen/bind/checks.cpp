#include "opgen/bind/checks.h"

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

std::string shape(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

void binary_other(const Signature& sig, const at::Tensor& other, const std::vector<int64_t>& result) {
  if (other.sizes() != c10::IntArrayRef(result)) {
    raise(PyExc_ValueError, sig,
          "argument 'other' must have the result's shape " + shape(result) + ", not " + shape(other.sizes()));
  }
  if (!other.is_non_overlapping_and_dense()) {
    raise(PyExc_ValueError, sig, "argument 'other' must be dense (contiguous or channels-last)");
  }
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

void attention_inputs(const Signature& sig, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  if (key.scalar_type() != query.scalar_type() || value.scalar_type() != query.scalar_type()) {
    raise(PyExc_TypeError, sig,
          std::string("arguments 'query', 'key' and 'value' must share one dtype, got ") +
              c10::toString(query.scalar_type()) + ", " + c10::toString(key.scalar_type()) + " and " +
              c10::toString(value.scalar_type()));
  }
}

void cudnn_attention_head_dim(const Signature& sig, const at::Tensor& query) {
  if (query.dim() >= 1 && query.size(-1) > 256) {
    raise(PyExc_ValueError, sig,
          "argument 'query': cuDNN attention takes a head dimension of at most 256, got " +
              std::to_string(query.size(-1)));
  }
}

void batch_norm_out_contiguous(const Signature& sig, const at::Tensor& input, bool training) {
  if (training && input.device().is_cpu() && !input.is_contiguous()) {
    raise(PyExc_ValueError, sig,
          "argument 'input' must be contiguous in training mode on the CPU (the out kernel reads a strided or "
          "channels-last input wrongly); pass input.contiguous(), or call the functional variant");
  }
}

void linear_binary_other(const Signature& sig, const at::Tensor& X, const at::Tensor& other, const at::Tensor& W) {
  if (X.dim() < 1 || W.dim() != 2) raise(PyExc_ValueError, sig, "X must have a dimension and W two");
  std::vector<int64_t> result(X.sizes().begin(), X.sizes().end());
  result.back() = W.size(0);
  binary_other(sig, other, result);
}

void conv_binary_other(const Signature& sig, const at::Tensor& X, const at::Tensor& other, const at::Tensor& W,
                       const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& dilation) {
  const size_t spatial = X.dim() > 2 ? static_cast<size_t>(X.dim() - 2) : 0;
  if (spatial == 0 || W.dim() != X.dim() || padding.size() != spatial || stride.size() != spatial ||
      dilation.size() != spatial) {
    raise(PyExc_ValueError, sig,
          "X and W need the same number (3 or more) of dimensions, and padding, stride and dilation one entry per "
          "spatial dimension");
  }
  std::vector<int64_t> result{X.size(0), W.size(0)};
  for (size_t d = 0; d < spatial; ++d) {
    if (stride[d] <= 0 || dilation[d] <= 0) raise(PyExc_ValueError, sig, "stride and dilation must be positive");
    const int64_t extent = dilation[d] * (W.size(static_cast<int64_t>(d) + 2) - 1) + 1;
    result.push_back((X.size(static_cast<int64_t>(d) + 2) + 2 * padding[d] - extent) / stride[d] + 1);
  }
  binary_other(sig, other, result);
}

bool shares_memory(const at::Tensor& out, const at::Tensor& input) {
  return out.has_storage() && input.has_storage() && out.storage().is_alias_of(input.storage());
}

bool shares_memory(const at::Tensor& out, const std::optional<at::Tensor>& input) {
  return input.has_value() && shares_memory(out, *input);
}

bool shares_memory(const at::Tensor& out, const std::vector<at::Tensor>& inputs) {
  for (const at::Tensor& input : inputs) {
    if (shares_memory(out, input)) return true;
  }
  return false;
}

bool shares_memory(const at::Tensor& out, const c10::List<std::optional<at::Tensor>>& inputs) {
  for (const std::optional<at::Tensor> input : inputs) {
    if (shares_memory(out, input)) return true;
  }
  return false;
}

void out_overlaps(const Signature& sig, int out, int input) {
  raise(PyExc_ValueError, sig,
        std::string("argument '") + sig.name(out) + "' shares memory with argument '" + sig.name(input) +
            "': an out variant writes separate outputs (a kernel that resizes its output would free the "
            "input's memory before reading it); use the in-place variant to write an input");
}

}  // namespace opgen::checks
