// InputCheck: the cheap metadata check at the top of a compiled function (opgen.runtime).
#pragma once

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace opgen {

// What one input must be: a plain torch.Tensor of this dtype, device, sizes and strides that does
// not require grad. Shared by InputCheck and the CUDA-graph runner.
struct ExpectedTensor {
  at::ScalarType dtype;
  at::Device device;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

// Parses (torch.dtype, torch.device, sizes, strides); TypeError on anything else.
ExpectedTensor expected_tensor(const pybind11::handle& spec);

// Whether `o` is such a tensor (no exception, no allocation).
bool matches(PyObject* o, const ExpectedTensor& e);

// Adds the type `InputCheck` to `m`. `InputCheck(specs)` takes a list of
// (dtype, device, sizes, strides); calling it with tensors returns True when each is a plain
// torch.Tensor (not a subclass) of that dtype, device, sizes and strides, not requiring grad.
void add_input_check(pybind11::module_& m);

// Adds `RangedInputCheck` (ranged_check.cpp): the check of functions compiled for dynamic shapes.
void add_ranged_input_check(pybind11::module_& m);

}  // namespace opgen
