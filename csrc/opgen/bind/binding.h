// Helpers shared by every generated kernel_ops binding: argument binding, conversion, device
// checks, result wrapping and error translation. Generated code calls these and repeats none of it.
#pragma once

#include <Python.h>

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "opgen/kernels/kernel_args.h"
#include "opgen/py/python_errors.h"

namespace opgen {

// The names and shape of one bound function's arguments, built once per function.
class Signature {
 public:
  Signature(const char* op, std::initializer_list<const char*> names, int max_positional,
            uint64_t required_mask);
  // Fill slots[0..n) from FASTCALL arguments; a missing optional argument leaves nullptr.
  void bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** slots) const;

  const char* op() const { return op_; }
  const char* name(int i) const { return names_[i]; }

 private:
  int index_of(PyObject* keyword) const;

  const char* op_;
  std::vector<const char*> names_;
  std::vector<PyObject*> interned_;
  int max_positional_;
  uint64_t required_mask_;
};

[[noreturn]] void raise(PyObject* type, const Signature& sig, const std::string& message);
[[noreturn]] void type_error(PyObject* got, const Signature& sig, int i, const char* expected);

// Tensors are borrowed from the Python object that holds them: no reference count traffic.
inline const at::Tensor& tensor(PyObject* o, const Signature& sig, int i) {
  if (!THPVariable_Check(o)) type_error(o, sig, i, "Tensor");
  return THPVariable_Unpack(o);
}
// A tensor the kernel writes into (inplace `self`, `out=`): the same tensor, not a copy.
inline at::Tensor& mutable_tensor(PyObject* o, const Signature& sig, int i) {
  return const_cast<at::Tensor&>(tensor(o, sig, i));
}

template <class T>
T convert(PyObject* o, const Signature& sig, int i);

template <class T>
std::optional<T> convert_optional(PyObject* o, const Signature& sig, int i) {
  if (o == Py_None) return std::nullopt;
  return convert<T>(o, sig, i);
}

// `int[N]` also takes one int, repeated N times (size 0: any length, no repetition).
std::vector<int64_t> int_list(PyObject* o, const Signature& sig, int i, int size);
std::optional<std::vector<int64_t>> optional_int_list(PyObject* o, const Signature& sig, int i, int size);

// `bool[N]`: exactly N bools (ATen takes them as std::array<bool, N>).
std::vector<bool> bool_list(PyObject* o, const Signature& sig, int i, int size);
template <size_t N>
std::array<bool, N> bool_array(PyObject* o, const Signature& sig, int i) {
  const std::vector<bool> v = bool_list(o, sig, i, static_cast<int>(N));
  std::array<bool, N> out{};
  for (size_t k = 0; k < N; ++k) out[k] = v[k];
  return out;
}

// Collects the device of every tensor argument, checks they agree, and names the kernel's device.
class Devices {
 public:
  explicit Devices(const Signature& sig) : sig_(sig) {}
  Devices& add(const at::Tensor& t, int i);
  Devices& add(const std::optional<at::Tensor>& t, int i) { return t ? add(*t, i) : *this; }
  // A tensor that may also be an opaque oneDNN (mkldnn-layout) CPU tensor: a packed weight (`opaque:`).
  Devices& add_opaque(const at::Tensor& t, int i);
  Devices& add(const std::vector<at::Tensor>& ts, int i);
  Devices& add(const c10::List<std::optional<at::Tensor>>& ts, int i);
  // Factory ops: the `device=` argument decides when no tensor does.
  Devices& add(const std::optional<at::Device>& d, int i);
  c10::DeviceType type() const { return device_ ? device_->type() : c10::DeviceType::CPU; }
  [[noreturn]] void no_kernel() const;

 private:
  void check(const at::Device& d, bool is_cpu_scalar, int i);

  const Signature& sig_;
  std::optional<at::Device> device_;
  int first_ = -1;
};

inline PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }
PyObject* wrap(std::vector<at::Tensor> ts);
// `int`/`SymInt` results beside tensors (fused attention's max_q): a kernel's SymInt is concrete.
PyObject* wrap(int64_t v);
inline PyObject* wrap(const c10::SymInt& v) { return wrap(v.expect_int()); }
template <class... T>
PyObject* wrap(std::tuple<T...> ts) {
  PyObject* out = PyTuple_New(sizeof...(T));
  if (out == nullptr) throw PythonError{};
  Py_ssize_t i = 0;
  std::apply([&](auto&... t) { ((PyTuple_SET_ITEM(out, i++, wrap(std::move(t)))), ...); }, ts);
  return out;
}
// Results that alias an argument written in place return that argument's own Python object.
inline PyObject* same(PyObject* o) {
  Py_INCREF(o);
  return o;
}
PyObject* same_tuple(std::initializer_list<PyObject*> objects);

// Runs a long kernel with the GIL released.
template <class F>
auto without_gil(F&& f) {
  PyThreadState* state = PyEval_SaveThread();
  try {
    auto result = f();
    PyEval_RestoreThread(state);
    return result;
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
}

// raise_current (python_errors.h), naming the op: `kernel_ops.<op>(): <message>`.
PyObject* raise_current(const Signature& sig);

}  // namespace opgen

#define OPGEN_TRY try {
#define OPGEN_CATCH(sig)                \
  }                                     \
  catch (...) {                         \
    return ::opgen::raise_current(sig); \
  }
