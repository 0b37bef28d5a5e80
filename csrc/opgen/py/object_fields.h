// The Python objects a C++ Python type holds, named once for the cyclic GC. A type `T` lists them
// in one member function that calls `f(PyObject*&)` on each reference it holds, null or not:
//
//   template <typename F>
//   void for_each_object(F&& f) { f(fallback); f(dict); }
//
// and its slots take `traverse_objects<T>` as tp_traverse and `clear_objects<T>` as tp_clear (its
// dealloc calls the latter too). Adding a field to the list is the one change that makes GC see it.
#pragma once

#include <Python.h>

namespace opgen {

// tp_traverse: visits every object `T::for_each_object` names, stopping at the first nonzero result
// (as Py_VISIT does).
template <typename T>
int traverse_objects(PyObject* self, visitproc visit, void* arg) {
  int result = 0;
  reinterpret_cast<T*>(self)->for_each_object([&](PyObject*& o) {
    if (result == 0 && o != nullptr) result = visit(o, arg);
  });
  return result;
}

// tp_clear: drops every reference `T::for_each_object` names (Py_CLEAR: null first, then decref).
template <typename T>
int clear_objects(PyObject* self) {
  reinterpret_cast<T*>(self)->for_each_object([](PyObject*& o) { Py_CLEAR(o); });
  return 0;
}

}  // namespace opgen
