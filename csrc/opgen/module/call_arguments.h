// A call's arguments bound to a program's inputs as Python binds a call of the generated function
// (by position or by name), and Python's messages where they do not fit (executor_py.cpp).
#pragma once

#include <Python.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <string>
#include <vector>

#include "opgen/exec/executor.h"

namespace opgen {

// opgen.runtime.errors.<name> (imported on the error path only), or `fallback` where it cannot be.
inline PyObject* opgen_error(const char* name, PyObject* fallback) {
  PyObject* module = PyImport_ImportModule("opgen.runtime.errors");
  PyObject* cls = module != nullptr ? PyObject_GetAttrString(module, name) : nullptr;
  Py_XDECREF(module);
  if (cls == nullptr) {
    PyErr_Clear();
    return fallback;
  }
  Py_DECREF(cls);  // the module keeps it alive
  return cls;
}

// Missing arguments (the inputs at `missing`), said as Python says it of the generated function.
inline PyObject* missing_error(const exec::Program& program, const std::vector<size_t>& missing) {
  std::string names;  // 'x', 'y' and 'z' / 'x', 'y', and 'z' as CPython lists them
  const size_t count = missing.size();
  for (size_t k = 0; k < count; ++k) {
    if (k > 0) names += count > 2 ? (k + 1 == count ? ", and " : ", ") : " and ";
    names += "'" + program.inputs()[missing[k]].name + "'";
  }
  return PyErr_Format(opgen_error("InputTypeError", PyExc_TypeError),
                      "%s() missing %zu required positional argument%s: %s", program.name().c_str(),
                      count, count == 1 ? "" : "s", names.c_str());
}

// Wrong number of positional arguments, said as Python says it of the generated function.
inline PyObject* arity_error(const exec::Program& program, Py_ssize_t n) {
  const auto expected = static_cast<Py_ssize_t>(program.inputs().size());
  if (n >= expected) {
    return PyErr_Format(opgen_error("InputTypeError", PyExc_TypeError),
                        "%s() takes %zd positional arguments but %zd were given",
                        program.name().c_str(), expected, n);
  }
  std::vector<size_t> missing;
  for (Py_ssize_t i = n; i < expected; ++i) missing.push_back(static_cast<size_t>(i));
  return missing_error(program, missing);
}

// Keyword arguments bound to the inputs of their names, as Python binds a call of the generated
// function (`forward(x, y=y)`); false with Python's TypeError where they do not fit.
inline bool bind_keywords(const exec::Program& program, PyObject* const* args, Py_ssize_t n,
                          PyObject* kwnames, c10::SmallVector<PyObject*, 8>& bound) {
  const auto& inputs = program.inputs();
  if (n > static_cast<Py_ssize_t>(inputs.size())) {
    arity_error(program, n);
    return false;
  }
  bound.assign(inputs.size(), nullptr);
  std::copy(args, args + n, bound.begin());
  PyObject* type = opgen_error("InputTypeError", PyExc_TypeError);
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); ++k) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
    if (name == nullptr) return false;
    const auto it = std::find_if(inputs.begin(), inputs.end(),
                                 [&](const exec::InputSpec& s) { return s.name == name; });
    if (it == inputs.end()) {
      PyErr_Format(type, "%s() got an unexpected keyword argument '%s'", program.name().c_str(),
                   name);
      return false;
    }
    PyObject*& slot = bound[it - inputs.begin()];
    if (slot != nullptr) {
      PyErr_Format(type, "%s() got multiple values for argument '%s'", program.name().c_str(),
                   name);
      return false;
    }
    slot = args[n + k];
  }
  std::vector<size_t> missing;
  for (size_t i = 0; i < bound.size(); ++i) {
    if (bound[i] == nullptr) missing.push_back(i);
  }
  if (missing.empty()) return true;
  missing_error(program, missing);
  return false;
}

}  // namespace opgen
