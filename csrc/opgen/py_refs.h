// What reaches a Python object besides its strong references: for the results opgen recycles
// (executor_py.cpp, cuda_graph.cpp), which must be reachable by nothing but opgen.
#pragma once

#include <Python.h>

namespace opgen {

// Whether a weak reference to `o` exists. `tp_weaklistoffset` is negative where the interpreter
// manages the list before the object (Python 3.12+, Py_TPFLAGS_MANAGED_WEAKREF): torch.Tensor's
// case there.
inline bool weakly_referenced(PyObject* o) {
  const Py_ssize_t offset = Py_TYPE(o)->tp_weaklistoffset;
  return offset != 0 &&
         *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset) != nullptr;
}

}  // namespace opgen
