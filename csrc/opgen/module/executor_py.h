// The Python glue of the C++ executor (executor_py.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace opgen {

// Adds `cpp_function(text, constants, externs, handler, proceed, unflatten, resolver)` and the type
// `CppFunction` to `m`.
void add_executor(pybind11::module_& m);

}  // namespace opgen
