#include "opgen/bind/binding.h"

#include <c10/util/Exception.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>

#include <string>

namespace opgen {

Signature::Signature(const char* op, std::initializer_list<const char*> names, int max_positional,
                     uint64_t required_mask)
    : op_(op), names_(names), max_positional_(max_positional), required_mask_(required_mask) {
  interned_.reserve(names_.size());
  for (const char* name : names_) interned_.push_back(PyUnicode_InternFromString(name));
}

int Signature::index_of(PyObject* keyword) const {
  const int n = static_cast<int>(interned_.size());
  for (int i = 0; i < n; ++i) {
    if (interned_[i] == keyword) return i;
  }
  for (int i = 0; i < n; ++i) {
    if (PyUnicode_Compare(interned_[i], keyword) == 0) return i;
  }
  return -1;
}

void Signature::bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     PyObject** slots) const {
  const int n = static_cast<int>(names_.size());
  if (nargs > max_positional_) {
    raise(PyExc_TypeError, *this,
          "takes at most " + std::to_string(max_positional_) + " positional arguments (" +
              std::to_string(nargs) + " given)");
  }
  for (int i = 0; i < n; ++i) slots[i] = i < nargs ? args[i] : nullptr;
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* keyword = PyTuple_GET_ITEM(kwnames, k);
    const int i = index_of(keyword);
    if (i < 0) {
      // %R, not PyUnicode_AsUTF8: a keyword need not be encodable (a lone surrogate gives NULL).
      PyErr_Format(PyExc_TypeError, "kernel_ops.%s(): got an unexpected keyword argument %R", op_,
                   keyword);
      throw PythonError{};
    }
    if (slots[i] != nullptr) {
      raise(PyExc_TypeError, *this,
            std::string("got multiple values for argument '") + names_[i] + "'");
    }
    slots[i] = args[nargs + k];
  }
  for (int i = 0; i < n; ++i) {
    if (slots[i] == nullptr && (required_mask_ >> i & 1)) {
      raise(PyExc_TypeError, *this,
            std::string("missing required argument '") + names_[i] + "' (pos " +
                std::to_string(i + 1) + ")");
    }
  }
}

void raise(PyObject* type, const Signature& sig, const std::string& message) {
  PyErr_Format(type, "kernel_ops.%s(): %s", sig.op(), message.c_str());
  throw PythonError{};
}

void type_error(PyObject* got, const Signature& sig, int i, const char* expected) {
  PyErr_Format(PyExc_TypeError, "kernel_ops.%s(): argument '%s' (position %d) must be %s, not %s",
               sig.op(), sig.name(i), i + 1, expected, Py_TYPE(got)->tp_name);
  throw PythonError{};
}

namespace {

bool is_int(PyObject* o) { return PyLong_Check(o) && !PyBool_Check(o); }

int64_t as_int64(PyObject* o, const Signature& sig, int i) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    raise(PyExc_OverflowError, sig, std::string("argument '") + sig.name(i) + "' does not fit in int64");
  }
  return v;
}

// An int where a float goes: like Python's float(), so only ints beyond ~1.8e308 overflow.
double as_double(PyObject* o, const Signature& sig, int i) {
  const double v = PyLong_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    raise(PyExc_OverflowError, sig,
          std::string("argument '") + sig.name(i) + "' does not fit in a float");
  }
  return v;
}

}  // namespace

template <>
int64_t convert<int64_t>(PyObject* o, const Signature& sig, int i) {
  if (!is_int(o)) type_error(o, sig, i, "int");
  return as_int64(o, sig, i);
}

template <>
double convert<double>(PyObject* o, const Signature& sig, int i) {
  if (PyFloat_Check(o)) return PyFloat_AS_DOUBLE(o);
  if (is_int(o)) return as_double(o, sig, i);
  type_error(o, sig, i, "float");
}

template <>
bool convert<bool>(PyObject* o, const Signature& sig, int i) {
  if (!PyBool_Check(o)) type_error(o, sig, i, "bool");
  return o == Py_True;
}

template <>
at::Scalar convert<at::Scalar>(PyObject* o, const Signature& sig, int i) {
  if (PyBool_Check(o)) return at::Scalar(o == Py_True);
  if (PyLong_Check(o)) return at::Scalar(as_int64(o, sig, i));
  if (PyFloat_Check(o)) return at::Scalar(PyFloat_AS_DOUBLE(o));
  if (PyComplex_Check(o)) {
    return at::Scalar(c10::complex<double>(PyComplex_RealAsDouble(o), PyComplex_ImagAsDouble(o)));
  }
  // A tensor is refused, even a one-element one, as eager's torch.ops.aten.* refuses it: pass
  // t.item() (which on CUDA synchronizes), or use the op's Tensor overload.
  type_error(o, sig, i, "a number (Scalar)");
}

template <>
std::string convert<std::string>(PyObject* o, const Signature& sig, int i) {
  if (!PyUnicode_Check(o)) type_error(o, sig, i, "str");
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(o, &size);
  if (data == nullptr) {  // a lone surrogate: not encodable as UTF-8
    PyErr_Clear();
    raise(PyExc_ValueError, sig,
          std::string("argument '") + sig.name(i) + "' is not valid UTF-8 text");
  }
  return std::string(data, size);
}

template <>
at::ScalarType convert<at::ScalarType>(PyObject* o, const Signature& sig, int i) {
  if (!THPDtype_Check(o)) type_error(o, sig, i, "torch.dtype");
  return reinterpret_cast<THPDtype*>(o)->scalar_type;
}

template <>
at::Layout convert<at::Layout>(PyObject* o, const Signature& sig, int i) {
  if (!THPLayout_Check(o)) type_error(o, sig, i, "torch.layout");
  return reinterpret_cast<THPLayout*>(o)->layout;
}

template <>
at::MemoryFormat convert<at::MemoryFormat>(PyObject* o, const Signature& sig, int i) {
  if (!THPMemoryFormat_Check(o)) type_error(o, sig, i, "torch.memory_format");
  return reinterpret_cast<THPMemoryFormat*>(o)->memory_format;
}

template <>
at::Device convert<at::Device>(PyObject* o, const Signature& sig, int i) {
  if (THPDevice_Check(o)) return reinterpret_cast<THPDevice*>(o)->device;
  if (PyUnicode_Check(o)) return at::Device(convert<std::string>(o, sig, i));
  type_error(o, sig, i, "torch.device or str");
}

namespace {

// Calls f(item, position) for each element of a list or tuple argument.
template <class F>
Py_ssize_t for_each_item(PyObject* o, const Signature& sig, int i, const char* expected, F&& f) {
  if (!PyList_Check(o) && !PyTuple_Check(o)) type_error(o, sig, i, expected);
  PyObject* fast = o;  // lists and tuples are already "fast" sequences
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t k = 0; k < n; ++k) f(items[k], k);
  return n;
}

[[noreturn]] void element_error(PyObject* item, const Signature& sig, int i, Py_ssize_t k,
                                const char* expected) {
  PyErr_Format(PyExc_TypeError,
               "kernel_ops.%s(): argument '%s' (position %d) must hold %s, but element %zd is %s",
               sig.op(), sig.name(i), i + 1, expected, k, Py_TYPE(item)->tp_name);
  throw PythonError{};
}

}  // namespace

// Like ATen's own parser, a list of another length than N passes through: kernels accept `[]` or
// `[k]` for some `int[2]` arguments (max_pool2d's stride) and check lengths themselves.
std::vector<int64_t> int_list(PyObject* o, const Signature& sig, int i, int size) {
  if (size > 0 && is_int(o)) return std::vector<int64_t>(size, as_int64(o, sig, i));
  std::vector<int64_t> out;
  for_each_item(o, sig, i, "a list of ints", [&](PyObject* item, Py_ssize_t k) {
    if (!is_int(item)) element_error(item, sig, i, k, "ints");
    out.push_back(as_int64(item, sig, i));
  });
  return out;
}

std::optional<std::vector<int64_t>> optional_int_list(PyObject* o, const Signature& sig, int i,
                                                      int size) {
  if (o == Py_None) return std::nullopt;
  return int_list(o, sig, i, size);
}

// `bool[N]` (ATen's `std::array<bool, N>`): a list or tuple of exactly N bools.
std::vector<bool> bool_list(PyObject* o, const Signature& sig, int i, int size) {
  std::vector<bool> out;
  const Py_ssize_t n = for_each_item(o, sig, i, "a list of bools", [&](PyObject* item, Py_ssize_t k) {
    if (!PyBool_Check(item)) element_error(item, sig, i, k, "bools");
    out.push_back(item == Py_True);
  });
  if (n != size) {
    PyErr_Format(PyExc_ValueError, "kernel_ops.%s(): argument '%s' (position %d) must hold %d bools, not %zd",
                 sig.op(), sig.name(i), i + 1, size, n);
    throw PythonError{};
  }
  return out;
}

template <>
std::vector<double> convert<std::vector<double>>(PyObject* o, const Signature& sig, int i) {
  std::vector<double> out;
  for_each_item(o, sig, i, "a list of floats", [&](PyObject* item, Py_ssize_t k) {
    if (PyFloat_Check(item)) {
      out.push_back(PyFloat_AS_DOUBLE(item));
    } else if (is_int(item)) {
      out.push_back(as_double(item, sig, i));
    } else {
      element_error(item, sig, i, k, "floats");
    }
  });
  return out;
}

template <>
std::vector<at::Tensor> convert<std::vector<at::Tensor>>(PyObject* o, const Signature& sig, int i) {
  std::vector<at::Tensor> out;
  for_each_item(o, sig, i, "a list of Tensors", [&](PyObject* item, Py_ssize_t k) {
    if (!THPVariable_Check(item)) element_error(item, sig, i, k, "Tensors");
    out.push_back(THPVariable_Unpack(item));
  });
  return out;
}

template <>
c10::List<std::optional<at::Tensor>> convert<c10::List<std::optional<at::Tensor>>>(
    PyObject* o, const Signature& sig, int i) {
  c10::List<std::optional<at::Tensor>> out;
  for_each_item(o, sig, i, "a list of Tensors or None", [&](PyObject* item, Py_ssize_t k) {
    if (item == Py_None) {
      out.push_back(std::nullopt);
    } else if (THPVariable_Check(item)) {
      out.push_back(THPVariable_Unpack(item));
    } else {
      element_error(item, sig, i, k, "Tensors or None");
    }
  });
  return out;
}

template <>
at::Tensor convert<at::Tensor>(PyObject* o, const Signature& sig, int i) {
  return tensor(o, sig, i);
}

void Devices::check(const at::Device& d, bool is_cpu_scalar, int i) {
  if (!device_) {
    device_ = d;
    first_ = i;
    return;
  }
  if (d == *device_) return;
  // Like ATen's TensorIterator, a zero-dim CPU tensor may join tensors of another device.
  if (is_cpu_scalar) return;
  raise(PyExc_RuntimeError, sig_,
        std::string("expected all tensors on one device, but '") + sig_.name(i) + "' is on " +
            d.str() + " and '" + sig_.name(first_) + "' is on " + device_->str());
}

namespace {

// Tensors whose data a direct kernel cannot read as it stands: the dispatcher would first resolve a
// lazy negation/conjugation, or hand the call to Python (FakeTensor, __torch_dispatch__ subclasses)
// or to functionalization. Direct kernels would read wrong values, or no storage at all.
const c10::DispatchKeySet kIndirect({c10::DispatchKey::Negative, c10::DispatchKey::Conjugate,
                                     c10::DispatchKey::Python, c10::DispatchKey::Functionalize});

std::string why_indirect(const at::Tensor& t) {
  if (t.key_set().has(c10::DispatchKey::Python)) {
    return "is a tensor subclass or fake tensor handled by __torch_dispatch__; kernel_ops needs "
           "plain tensors";
  }
  if (t.key_set().has(c10::DispatchKey::Functionalize)) {
    return "is a functional tensor; kernel_ops needs plain tensors";
  }
  return std::string("has a lazy ") + (t.is_neg() ? "negation" : "conjugation") +
         " bit; call .resolve_neg() / .resolve_conj() first";
}

}  // namespace

Devices& Devices::add(const at::Tensor& t, int i) {
  if (!t.defined()) return *this;
  const auto arg = [&] { return std::string("argument '") + sig_.name(i) + "' "; };
  if (t.layout() != at::kStrided || t.is_nested()) {
    raise(PyExc_TypeError, sig_,
          arg() + "must be a strided (dense) tensor, not " +
              (t.is_nested() ? std::string("nested") : c10::str(t.layout())));
  }
  if (t.key_set().has_any(kIndirect)) raise(PyExc_TypeError, sig_, arg() + why_indirect(t));
  if (t.is_quantized()) raise(PyExc_TypeError, sig_, arg() + "is quantized");
  check(t.device(), t.device().is_cpu() && t.dim() == 0, i);
  return *this;
}

Devices& Devices::add_opaque(const at::Tensor& t, int i) {
  if (!t.defined() || t.layout() != at::kMkldnn) return add(t, i);
  check(t.device(), false, i);
  return *this;
}

Devices& Devices::add(const std::vector<at::Tensor>& ts, int i) {
  for (const auto& t : ts) add(t, i);
  return *this;
}

Devices& Devices::add(const c10::List<std::optional<at::Tensor>>& ts, int i) {
  for (const std::optional<at::Tensor> t : ts) add(t, i);
  return *this;
}

Devices& Devices::add(const std::optional<at::Device>& d, int i) {
  if (d && !device_) check(*d, false, i);
  return *this;
}

void Devices::no_kernel() const {
  raise(PyExc_NotImplementedError, sig_,
        std::string("has no kernel for device type '") + c10::DeviceTypeName(type(), true) +
            "' in this build");
}

PyObject* wrap(std::vector<at::Tensor> ts) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(ts.size()));
  if (out == nullptr) throw PythonError{};
  for (size_t k = 0; k < ts.size(); ++k) PyList_SET_ITEM(out, k, wrap(std::move(ts[k])));
  return out;
}

PyObject* wrap(int64_t v) {
  PyObject* out = PyLong_FromLongLong(v);
  if (out == nullptr) throw PythonError{};
  return out;
}

PyObject* same_tuple(std::initializer_list<PyObject*> objects) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(objects.size()));
  if (out == nullptr) throw PythonError{};
  Py_ssize_t k = 0;
  for (PyObject* o : objects) PyTuple_SET_ITEM(out, k++, same(o));
  return out;
}

PyObject* raise_current(const Signature& sig) { return raise_current(std::string("kernel_ops.") + sig.op() + "(): "); }

}  // namespace opgen
