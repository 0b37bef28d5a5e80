// The externs of the C++ executor under Python (executor.h's `Extern`): a program's `call` lines
// call Python callables (a fused kernel's choice, a `py:` function, a collective) with the GIL, and
// Triton launchers (opgen._C.JitLauncher) from C++ with no Python once a compiled variant fits.
// Also the conversions between register values and Python objects the executor's glue shares.
#pragma once

#include <ATen/core/ivalue.h>
#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "opgen/exec/executor.h"

namespace opgen {

// Consumes `v`: a tensor's only reference goes to its new PyObject (no reference count change).
// Null with a Python error set where the value has no Python form.
PyObject* to_python(c10::IValue&& v);

// The externs `program` names, from `externs` (name -> callable), in the program's order; a
// JitLauncher launches from C++. ValueError where a name has no callable.
std::vector<std::shared_ptr<const exec::Extern>> externs_of(const exec::Program& program,
                                                            const pybind11::dict& externs);

}  // namespace opgen
