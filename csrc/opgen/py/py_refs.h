// What reaches a Python object besides its strong references: for the results opgen recycles
// (executor_py.cpp, cuda_graph.cpp), which must be reachable by nothing but opgen.
#pragma once

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

namespace opgen {

// Whether a weak reference to `o` exists. `tp_weaklistoffset` is negative where the interpreter
// manages the list before the object (Python 3.12+, Py_TPFLAGS_MANAGED_WEAKREF): torch.Tensor's
// case there.
inline bool weakly_referenced(PyObject* o) {
  const Py_ssize_t offset = Py_TYPE(o)->tp_weaklistoffset;
  return offset != 0 &&
         *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset) != nullptr;
}

// Whether nothing but opgen's one reference reaches the tensor object `o` or its memory: no other
// reference to the object, no weak reference, no other tensor or storage object on its storage (a
// view, a NumPy array holds the object). What more each recycler asks of it, it checks itself.
inline bool only_opgen_reaches(PyObject* o) {
  if (Py_REFCNT(o) != 1 || weakly_referenced(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  return t.use_count() == 1 && t.storage().use_count() == 1;
}

}  // namespace opgen
