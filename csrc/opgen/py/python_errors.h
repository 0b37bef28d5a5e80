// C++ exceptions as Python ones, for every entry point Python calls (bindings, the executor).
#pragma once

#include <Python.h>

#include <string>

namespace opgen {

// Thrown after a Python exception has been set; the entry point returns nullptr.
struct PythonError {};

// Turns the C++ exception in flight into the Python exception of its kind (IndexError, ValueError,
// TypeError, NotImplementedError, MemoryError, else RuntimeError), its message after `prefix`; a
// PythonError (a Python error already set) passes through. Returns nullptr.
PyObject* raise_current(const std::string& prefix);

}  // namespace opgen
