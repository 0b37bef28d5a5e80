// The Python face of the thunk registry (exec/thunk_registry.h): what lets this module's executor
// call the thunks of another extension built with opgen_add_extension.
#pragma once

#include <pybind11/pybind11.h>

namespace opgen {

// Adds `THUNKS` (a capsule named "opgen.thunks" of this module's exec::ThunkExport), `THUNK_ABI`,
// `register_thunks(prefix, capsule)` and `registered_thunks()` to `m`.
void add_thunks(pybind11::module_& m);

}  // namespace opgen
