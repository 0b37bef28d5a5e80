// Recycled results (the program's `recycle` lines, opgen.runtime.codegen.cpp_recycle): the C++
// function keeps each result it returned that a `recycle` line makes, and the next call writes
// its value into it when nothing but the function reaches it any more. Python glue only
// (executor_py.cpp): the executor's core takes the tensors to write as `Program::run`'s
// `recycled`.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

#include "opgen/exec/executor.h"
#include "opgen/py/py_refs.h"

namespace opgen {

// A result the function returned that the next call may write its value into, once the caller has
// let go of it (the program's `recycle` lines): the object, and the metadata it was made with.
struct Kept {
  bool on = false;             // the return value has a `recycle` line
  PyObject* object = nullptr;  // a reference of ours (null: none)
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
};

// Whether nothing but the function reaches `o` any more and it is still the tensor the program
// made: no other reference to the object, no weak reference, no attribute, no view or other tensor
// on its storage, no autograd state, no conj or neg bit, the same dtype, sizes and strides.
inline bool dropped(PyObject* o, const Kept& k) {
  if (!THPVariable_CheckExact(o) || !only_opgen_reaches(o)) return false;
  PyObject** dict = _PyObject_GetDictPtr(o);
  if (dict != nullptr && *dict != nullptr && PyDict_GET_SIZE(*dict) != 0) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  return t.unsafeGetTensorImpl()->autograd_meta() == nullptr && !t.is_conj() && !t.is_neg() &&
         t.scalar_type() == k.dtype && t.storage_offset() == 0 &&
         t.sizes() == c10::IntArrayRef(k.sizes) && t.strides() == c10::IntArrayRef(k.strides);
}

// Keeps return value `i`, `item`, for the next call to write into once the caller drops it.
inline void keep(std::vector<Kept>* kept, size_t i, PyObject* item) {
  if (kept == nullptr || i >= kept->size() || !(*kept)[i].on) return;
  Kept& k = (*kept)[i];
  if (item == k.object || item == nullptr || !THPVariable_CheckExact(item)) return;  // same: known
  const at::Tensor& t = THPVariable_Unpack(item);
  k.dtype = t.scalar_type();
  k.sizes.assign(t.sizes().begin(), t.sizes().end());
  k.strides.assign(t.strides().begin(), t.strides().end());
  Py_INCREF(item);
  Py_XSETREF(k.object, item);
}

// The kept results a call writes into (`recycled`, by return value: those the caller has dropped),
// each held by one more reference through the call, so that no other call takes it meanwhile; the
// tensors borrow the objects' (exec::borrowed). The program's results written into them come back
// borrowed too (Program::run): `take` turns them into the objects themselves.
struct Lent {
  c10::SmallVector<at::Tensor, 4> recycled;
  c10::SmallVector<PyObject*, 4> objects;  // by return value: the object lent (null: none)

  Lent(const Lent&) = delete;
  Lent& operator=(const Lent&) = delete;
  explicit Lent(std::vector<Kept>* kept) {
    if (kept == nullptr) return;
    recycled.resize(kept->size());
    objects.resize(kept->size(), nullptr);
    for (size_t i = 0; i < kept->size(); ++i) {
      PyObject* o = (*kept)[i].object;
      if (o == nullptr || !dropped(o, (*kept)[i])) continue;
      recycled[i] = exec::borrowed(THPVariable_Unpack(o));
      Py_INCREF(o);
      objects[i] = o;
    }
  }

  // After a run: each result written into a lent object, given back, becomes that object. Returns
  // the objects by return value (new references for the caller to take; null where none).
  c10::SmallVector<PyObject*, 4> take(exec::Results& results) {
    c10::SmallVector<PyObject*, 4> taken(results.size(), nullptr);
    for (size_t i = 0; i < results.size(); ++i) {
      if (!exec::Program::wrote_into(results[i], recycled, i)) continue;
      exec::give_back(std::move(results[i]).toTensor());
      std::swap(taken[i], objects[i]);  // our reference goes to the caller
    }
    return taken;
  }

  ~Lent() {  // with the GIL
    for (at::Tensor& t : recycled) {
      if (t.defined()) exec::give_back(std::move(t));
    }
    for (PyObject* o : objects) Py_XDECREF(o);
  }
};

}  // namespace opgen
