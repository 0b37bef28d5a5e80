#include "opgen/py/input_check.h"
#include "opgen/py/vectorcall_type.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstddef>
#include <new>
#include <vector>

namespace py = pybind11;

namespace opgen {

bool matches(PyObject* o, const ExpectedTensor& e) {
  if (!THPVariable_CheckExact(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (t.scalar_type() != e.dtype || t.device() != e.device || t.requires_grad() ||
      t.sizes() != at::IntArrayRef(e.sizes)) {
    return false;
  }
  const auto strides = t.strides();
  for (size_t d = 0; d < e.strides.size(); ++d) {  // a dimension of size 1 never steps: its stride is free
    if (strides[d] != e.strides[d] && e.sizes[d] != 1) return false;
  }
  return true;
}

ExpectedTensor expected_tensor(const py::handle& spec) {
  const auto item = spec.cast<py::tuple>();
  if (item.size() != 4 || !THPDtype_Check(item[0].ptr()) || !THPDevice_Check(item[1].ptr())) {
    throw py::type_error("each input spec is (torch.dtype, torch.device, sizes, strides)");
  }
  return {reinterpret_cast<THPDtype*>(item[0].ptr())->scalar_type,
          reinterpret_cast<THPDevice*>(item[1].ptr())->device,
          item[2].cast<std::vector<int64_t>>(), item[3].cast<std::vector<int64_t>>()};
}

namespace {

// A Python object whose call is a vectorcall: no argument tuple, no keyword parsing.
struct InputCheck {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<ExpectedTensor>* expected;
};

PyObject* check(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  const auto& expected = *reinterpret_cast<InputCheck*>(self)->expected;
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n != static_cast<Py_ssize_t>(expected.size())) Py_RETURN_FALSE;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!matches(args[i], expected[i])) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

void dealloc(PyObject* self) {
  delete reinterpret_cast<InputCheck*>(self)->expected;
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject* input_check_type() {
  static PyTypeObject type = vectorcall_type<InputCheck>(
      "opgen._C.InputCheck",
      "Compares tensors' dtype, device, sizes, strides and requires_grad with a spec.",
      {dealloc});
  return &type;
}

py::object make_input_check(const py::sequence& specs) {
  auto expected = std::make_unique<std::vector<ExpectedTensor>>();
  for (const py::handle spec : specs) expected->push_back(expected_tensor(spec));
  PyObject* self = PyType_GenericAlloc(input_check_type(), 0);
  if (self == nullptr) throw py::error_already_set();
  auto* check_object = reinterpret_cast<InputCheck*>(self);
  check_object->vectorcall = check;
  check_object->expected = expected.release();
  return py::reinterpret_steal<py::object>(self);
}

}  // namespace

void add_input_check(py::module_& m) {
  if (PyType_Ready(input_check_type()) != 0) throw py::error_already_set();
  m.def("InputCheck", &make_input_check, py::arg("specs"),
        "InputCheck([(dtype, device, sizes, strides), ...]): a callable returning True when its\n"
        "tensors are plain torch.Tensors with exactly that metadata and no requires_grad.");
}

}  // namespace opgen
