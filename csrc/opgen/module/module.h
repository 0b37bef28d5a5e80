// Module setup shared by every generated kernel_ops extension: the submodule, its raw FASTCALL
// functions, and the args-info registry. Nothing here is on a kernel call's path.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <span>

namespace opgen {

// One registry entry: a bound function's Python name and its args-info as JSON.
struct RegistryEntry {
  const char* name;
  const char* json;
};

// Adds `kernel_ops` to `parent` with the given method tables and registry.
void init_kernel_ops(pybind11::module_& parent, std::initializer_list<PyMethodDef*> tables,
                     std::span<const RegistryEntry> registry, const char* build_id);

}  // namespace opgen
