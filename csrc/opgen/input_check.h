// InputCheck: the cheap metadata check at the top of a compiled function (opgen.runtime).
#pragma once

#include <pybind11/pybind11.h>

namespace opgen {

// Adds the type `InputCheck` to `m`. `InputCheck(specs)` takes a list of
// (dtype, device, sizes, strides); calling it with tensors returns True when each is a plain
// torch.Tensor (not a subclass) of that dtype, device, sizes and strides, not requiring grad.
void add_input_check(pybind11::module_& m);

}  // namespace opgen
