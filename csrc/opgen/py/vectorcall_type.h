// The Python type of opgen's callable objects, in one place: a C++ struct that starts with
// PyObject_HEAD and `vectorcallfunc vectorcall;`, called with no argument tuple and no keyword parsing.
// input_check.cpp, ranged_check.cpp, cuda_graph.cpp and jit_launcher.cpp (JitLauncher and Switch) use it.
#pragma once

#include <Python.h>

#include <cstddef>

namespace opgen {

// What differs between the types besides name and doc: how an object is freed; for objects that hold
// other Python objects, the cyclic-GC hooks; members, properties and a __dict__ where they have them.
struct VectorcallSlots {
  destructor dealloc = nullptr;
  traverseproc traverse = nullptr;  // set: instances take part in cyclic GC (and `clear` breaks cycles)
  inquiry clear = nullptr;
  PyMemberDef* members = nullptr;
  PyGetSetDef* getset = nullptr;
  Py_ssize_t dict_offset = 0;     // nonzero: instances have a __dict__ at this offset
  Py_ssize_t weaklist_offset = 0;  // nonzero: instances can be weakly referenced (the list's offset;
                                   // dealloc calls PyObject_ClearWeakRefs)
  PyMethodDef* methods = nullptr;
};

// __copy__ and __deepcopy__ that return the object itself, as copying a Python function does: for
// the compiled functions users hold (a module holding one deep-copies).
inline PyMethodDef* copied_as_itself() {
  static PyMethodDef methods[] = {
      {"__copy__", [](PyObject* self, PyObject*) { return Py_NewRef(self); }, METH_NOARGS,
       "the object itself, as for a function"},
      {"__deepcopy__", [](PyObject* self, PyObject*) { return Py_NewRef(self); }, METH_O,
       "the object itself, as for a function"},
      {nullptr, nullptr, 0, nullptr},
  };
  return methods;
}

template <typename Object>
PyTypeObject vectorcall_type(const char* name, const char* doc, const VectorcallSlots& slots) {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = name;
  t.tp_doc = doc;
  t.tp_basicsize = sizeof(Object);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_vectorcall_offset = offsetof(Object, vectorcall);
  t.tp_call = PyVectorcall_Call;
  t.tp_dealloc = slots.dealloc;
  t.tp_members = slots.members;
  t.tp_getset = slots.getset;
  t.tp_methods = slots.methods;
  if (slots.traverse != nullptr) {
    t.tp_flags |= Py_TPFLAGS_HAVE_GC;
    t.tp_free = PyObject_GC_Del;
    t.tp_traverse = slots.traverse;
    t.tp_clear = slots.clear;
  }
  t.tp_weaklistoffset = slots.weaklist_offset;
  if (slots.dict_offset != 0) {
    t.tp_dictoffset = slots.dict_offset;
    t.tp_getattro = PyObject_GenericGetAttr;
    t.tp_setattro = PyObject_GenericSetAttr;
  }
  return t;
}

}  // namespace opgen
