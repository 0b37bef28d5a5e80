// The executor's externs under Python and the register <-> Python conversions (executor_externs.h).
#include "opgen/module/executor_externs.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <algorithm>
#include <string>
#include <utility>

#include "opgen/jit/jit.h"

namespace py = pybind11;

namespace opgen {

PyObject* to_python(c10::IValue&& v) {
  if (v.isTensor()) return THPVariable_Wrap(std::move(v).toTensor());
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isPyObject()) {
    PyObject* o = v.toPyObjectHolder()->getPyObject();
    Py_INCREF(o);
    return o;
  }
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isString()) {
    const std::string& text = v.toStringRef();
    return PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
  }
  if (v.isDevice()) return THPDevice_New(v.toDevice());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isList()) {
    const auto items = v.toListRef();
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(items.size()));
    if (list == nullptr) return nullptr;
    for (size_t i = 0; i < items.size(); ++i) {
      PyObject* item = to_python(c10::IValue(items[i]));
      if (item == nullptr) {
        Py_DECREF(list);
        return nullptr;
      }
      PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
    }
    return list;
  }
  PyErr_Format(PyExc_TypeError, "opgen program: cannot return a value of type %s",
               v.tagKind().c_str());
  return nullptr;
}

namespace {

// A Python object in a register (what an extern returned that is no tensor, number or list: a
// collective's work handle); released with the GIL, which the body may run without.
class HeldObject final : public c10::ivalue::PyObjectHolder {
 public:
  explicit HeldObject(PyObject* o) : object_(o) { Py_INCREF(o); }
  ~HeldObject() override {
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(object_);
    PyGILState_Release(gil);
  }
  PyObject* getPyObject() override { return object_; }
  c10::InferredType tryToInferType() override { return c10::InferredType("a Python object"); }
  c10::IValue toIValue(const c10::TypePtr&, std::optional<int32_t>) override {
    TORCH_CHECK(false, "opgen program: a Python object has no TorchScript value");
  }
  std::string toStr() override { return "a Python object"; }
  std::vector<at::Tensor> extractTensors() override { return {}; }

 private:
  PyObject* object_;
};

// A Python value as a register's value (with the GIL).
c10::IValue from_python(PyObject* o) {
  if (THPVariable_Check(o)) return THPVariable_Unpack(o);
  if (o == Py_None) return c10::IValue();
  if (PyBool_Check(o)) return c10::IValue(o == Py_True);
  if (PyLong_Check(o)) {
    const long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return c10::IValue(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(o)) return c10::IValue(PyFloat_AS_DOUBLE(o));
  if (PyTuple_Check(o) || PyList_Check(o)) {
    c10::impl::GenericList list(c10::AnyType::get());
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    for (Py_ssize_t i = 0; i < n; ++i) list.push_back(from_python(PySequence_Fast_GET_ITEM(o, i)));
    return c10::IValue(std::move(list));
  }
  return c10::IValue(
      c10::intrusive_ptr<c10::ivalue::PyObjectHolder>(c10::make_intrusive<HeldObject>(o)));
}

// The Python object of a dtype, layout or memory format a register holds as its number.
PyObject* enum_object(exec::Enum kind, int64_t value) {
  PyObject* o = nullptr;
  switch (kind) {
    case exec::Enum::kDtype:
      o = reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(value)));
      break;
    case exec::Enum::kLayout:
      o = reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(value)));
      break;
    case exec::Enum::kMemoryFormat:
      o = torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(value));
      break;
    case exec::Enum::kNone:
      break;
  }
  Py_XINCREF(o);  // torch's objects are borrowed
  return o;
}

// An extern that is a Python callable (a fused kernel's choice, a `py:` function, a collective):
// its operands as Python objects, positional then by name, called with the GIL; its result back
// into the output registers (unpacked from a tuple or list where the line unpacks).
class PythonCall final : public exec::Extern {
 public:
  explicit PythonCall(py::object fn) : fn_(std::move(fn)) {}

  void call(exec::Frame& f, const exec::Step& s) const override {
    const exec::Instr& in = s.instr;
    py::gil_scoped_acquire gil;
    const size_t n = in.args.size();
    std::vector<py::object> held;
    std::vector<PyObject*> args;
    held.reserve(n);
    args.reserve(n);
    for (size_t k = 0; k < n; ++k) {
      const c10::IValue& v = f.at(in.args[k]);
      PyObject* arg = s.enums[k] == exec::Enum::kNone ? to_python(c10::IValue(v))
                                                      : enum_object(s.enums[k], v.toInt());
      if (arg == nullptr) throw py::error_already_set();
      held.push_back(py::reinterpret_steal<py::object>(arg));
      args.push_back(arg);
    }
    py::object kwnames;
    if (!s.keywords.empty()) {
      kwnames = py::tuple(s.keywords.size());
      for (size_t k = 0; k < s.keywords.size(); ++k)
        PyTuple_SET_ITEM(kwnames.ptr(), k, py::str(s.keywords[k]).release().ptr());
    }
    const size_t positional = n - s.keywords.size();
    PyObject* result = PyObject_Vectorcall(fn_.ptr(), args.data(), positional, kwnames.ptr());
    if (result == nullptr) throw py::error_already_set();
    const py::object out = py::reinterpret_steal<py::object>(result);
    if (in.outs.empty()) return;
    if (!in.unpack) {
      exec::detail::store(f, in.outs[0], from_python(out.ptr()));
      return;
    }
    if (!PyTuple_Check(result) && !PyList_Check(result)) {
      throw py::type_error("opgen program: " + in.text + " unpacks its result, which is a " +
                           Py_TYPE(result)->tp_name);
    }
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(result);
    for (size_t k = 0; k < in.outs.size() && static_cast<Py_ssize_t>(k) < count; ++k)
      exec::detail::store(f, in.outs[k], from_python(PySequence_Fast_GET_ITEM(result, k)));
  }

 private:
  py::object fn_;
};

// An extern that is a Triton launcher (opgen._C.JitLauncher): launched from C++, no Python on its
// path once a compiled variant fits (jit.h's launch_with).
class LauncherCall final : public exec::Extern {
 public:
  explicit LauncherCall(py::object launcher) : launcher_(std::move(launcher)) {}

  void call(exec::Frame& f, const exec::Step& s) const override {
    const exec::Instr& in = s.instr;
    const bool returns =
        std::any_of(in.outs.begin(), in.outs.end(), [](int32_t r) { return r >= 0; });
    TORCH_CHECK(s.keywords.empty() && !returns,
                "a Triton launcher takes its arguments by position and returns nothing");
    c10::SmallVector<jit::Arg, 16> args(in.args.size());
    for (size_t i = 0; i < in.args.size(); ++i) {
      const c10::IValue& v = f.at(in.args[i]);
      if (v.isTensor()) {
        TORCH_CHECK_VALUE(v.toTensor().is_cuda(), "a Triton launcher's argument ", i,
                          " is a tensor on ", v.toTensor().device(), ", expected CUDA");
        args[i] = jit::tensor_arg(v.toTensor());
      } else if (v.isBool()) {
        args[i] = jit::bool_arg(v.toBool());
      } else if (v.isInt()) {
        args[i] = jit::int_arg(v.toInt());
      } else if (v.isDouble()) {
        args[i] = jit::float_arg(v.toDouble());
      } else {
        TORCH_CHECK(v.isNone(), "a Triton launcher's argument ", i, " is a ", v.tagKind());
        args[i] = jit::none_arg();
      }
    }
    jit::launch_with(launcher_.ptr(), args.data(), args.size());
  }

 private:
  py::object launcher_;
};

}  // namespace

std::vector<std::shared_ptr<const exec::Extern>> externs_of(const exec::Program& program,
                                                            const py::dict& externs) {
  std::vector<std::shared_ptr<const exec::Extern>> out;
  for (const std::string& name : program.extern_names()) {
    const py::str key(name);
    if (!externs.contains(key))
      throw py::value_error("no function for the program's extern " + name);
    py::object fn = externs[key];
    if (jit::is_launcher(fn.ptr())) {
      out.push_back(std::make_shared<LauncherCall>(std::move(fn)));
    } else {
      out.push_back(std::make_shared<PythonCall>(std::move(fn)));
    }
  }
  return out;
}

}  // namespace opgen
