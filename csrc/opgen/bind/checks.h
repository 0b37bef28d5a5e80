// Argument checks a spec entry asks for (`checks:` in ops.yaml; the list is opgen/spec/checks.py).
// Each guards a kernel that trusts its caller: torch's public functions check the same before they
// reach it, but a direct kernel call would read out of bounds instead of raising.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "opgen/bind/binding.h"

namespace opgen::checks {

// Eval-mode batch norm reads weight[c], bias[c], running_mean[c] and running_var[c] for every
// channel c < input.size(1): each defined one must hold that many elements (a ValueError otherwise).
void batch_norm_channels(const Signature& sig, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                         const at::Tensor& running_var);

// The FFT kernels index self's sizes by each of `dim` and assume no dimension comes twice (a
// repeated one reads past the end of their plan): `dim` must be non-empty, in range and distinct.
void fft_dims(const Signature& sig, const at::Tensor& self, const std::vector<int64_t>& dim);

// The fused attention kernels read key and value as query's dtype: all three must share it (a TypeError).
void attention_inputs(const Signature& sig, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value);

// cuDNN's attention takes a head dimension of at most 256; a direct call with a larger one returned
// without an error: refused with a ValueError.
void cudnn_attention_head_dim(const Signature& sig, const at::Tensor& query);

// `_native_batch_norm_legit.out` in training mode on the CPU reads a strided or channels-last input
// as if it were contiguous (wrong statistics, and uninitialized memory in save_mean, in eager torch
// too): such an input is refused with a ValueError. The functional kernel handles it.
void batch_norm_out_contiguous(const Signature& sig, const at::Tensor& input, bool training);

// oneDNN's binary post-ops read `other` as a dense tensor of the result's shape and trust it (a
// smaller one is read past its end, through torch.ops.mkldnn too): it must have that shape and be
// dense (a ValueError otherwise). The result is X's shape with the last size W.size(0) for a linear,
// and (N, W.size(0), spatial sizes...) for a convolution.
void linear_binary_other(const Signature& sig, const at::Tensor& X, const at::Tensor& other, const at::Tensor& W);
void conv_binary_other(const Signature& sig, const at::Tensor& X, const at::Tensor& other, const at::Tensor& W,
                       const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& dilation);

// Every out variant (the generator emits these, no spec entry asks): an out argument must share no
// memory with an input. A kernel whose result's shape differs from out's resizes out, which frees
// the input's memory, and then reads the input (heap corruption; eager torch.ops.aten does the same
// for the padding, pooling and other shape-changing kernels). Such an out is refused with a
// ValueError for every out variant: the in-place variant is the way to write an input.
bool shares_memory(const at::Tensor& out, const at::Tensor& input);
bool shares_memory(const at::Tensor& out, const std::optional<at::Tensor>& input);
bool shares_memory(const at::Tensor& out, const std::vector<at::Tensor>& inputs);
bool shares_memory(const at::Tensor& out, const c10::List<std::optional<at::Tensor>>& inputs);
[[noreturn]] void out_overlaps(const Signature& sig, int out, int input);

template <typename Input>
inline void out_not_input(const Signature& sig, const at::Tensor& out, int out_index, const Input& input,
                          int input_index) {
  if (shares_memory(out, input)) out_overlaps(sig, out_index, input_index);
}

}  // namespace opgen::checks
