// CPU builds (torch without CUDA): Triton ops exist in kernel_ops and the registry, and calling
// one raises a RuntimeError saying what is missing. jit_launcher.cpp replaces this file in CUDA
// builds (opgen/cmake/opgen.cmake chooses).
#include "opgen/bind/binding.h"
#include "opgen/jit/jit.h"
#include "opgen/jit/jit_binding.h"

namespace opgen::jit {

void launch(SpecKernel& kernel, std::initializer_list<Arg>) {
  PyErr_SetString(PyExc_RuntimeError, no_jit_message(kernel.op).c_str());
  throw PythonError{};
}

bool is_launcher(PyObject*) { return false; }

void launch_with(PyObject*, const Arg*, size_t) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyErr_SetString(PyExc_RuntimeError,
                  "opgen.jit: this build of opgen has no CUDA: no Triton launches");
  PyGILState_Release(gil);
  throw PythonError{};
}

void add_jit(pybind11::module_&) {}

}  // namespace opgen::jit
