// RangedInputCheck: InputCheck for functions compiled with dynamic shapes (opgen.runtime.execution.dynamic_guards).
//
// A size entry >= 0 is a fixed size; -(k + 1) is size symbol k: its first occurrence binds it, the
// others must equal it, and it must lie in range k. A stride entry >= 0 is fixed; kContiguous is the
// row-major stride at this call's sizes (the product of the sizes to its right, as torch computes
// it). The static InputCheck is untouched: static graphs keep their check as it was.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "opgen/py/input_check.h"
#include "opgen/py/vectorcall_type.h"

namespace py = pybind11;

namespace opgen {
namespace {

constexpr int64_t kContiguous = -1;

struct Range {
  int64_t low;
  int64_t high;  // -1: unbounded
};

struct Ranged {
  std::vector<ExpectedTensor> expected;  // sizes/strides as described above
  std::vector<Range> ranges;             // per size symbol
};

bool bind(int64_t entry, int64_t actual, std::vector<int64_t>& env, const std::vector<Range>& ranges) {
  if (entry >= 0) return actual == entry;
  const size_t k = static_cast<size_t>(-entry - 1);
  if (env[k] >= 0) return env[k] == actual;
  const Range& r = ranges[k];
  if (actual < r.low || (r.high >= 0 && actual > r.high)) return false;
  env[k] = actual;
  return true;
}

bool matches_ranged(PyObject* o, const ExpectedTensor& e, std::vector<int64_t>& env,
                    const std::vector<Range>& ranges) {
  if (!THPVariable_CheckExact(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (t.scalar_type() != e.dtype || t.device() != e.device || t.requires_grad()) return false;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  if (sizes.size() != e.sizes.size()) return false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (!bind(e.sizes[d], sizes[d], env, ranges)) return false;
  }
  int64_t step = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    const int64_t want = e.strides[d] == kContiguous ? step : e.strides[d];
    if (strides[d] != want && sizes[d] != 1) return false;  // a dimension of size 1 never steps
    step *= sizes[d] > 1 ? sizes[d] : 1;
  }
  return true;
}

struct RangedCheck {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Ranged* spec;
};

PyObject* check(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  const Ranged& spec = *reinterpret_cast<RangedCheck*>(self)->spec;
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n != static_cast<Py_ssize_t>(spec.expected.size())) Py_RETURN_FALSE;
  std::vector<int64_t> env(spec.ranges.size(), -1);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!matches_ranged(args[i], spec.expected[i], env, spec.ranges)) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

void dealloc(PyObject* self) {
  delete reinterpret_cast<RangedCheck*>(self)->spec;
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject* ranged_check_type() {
  static PyTypeObject type = vectorcall_type<RangedCheck>(
      "opgen._C.RangedInputCheck",
      "InputCheck with size symbols: ranges, equal occurrences, row-major strides at the call's sizes.",
      {dealloc});
  return &type;
}

py::object make_ranged_check(const py::sequence& specs, const py::sequence& ranges) {
  auto spec = std::make_unique<Ranged>();
  for (const py::handle item : ranges) {
    const auto pair = item.cast<std::pair<int64_t, int64_t>>();
    spec->ranges.push_back({pair.first, pair.second});
  }
  for (const py::handle item : specs) {
    ExpectedTensor e = expected_tensor(item);
    if (e.sizes.size() != e.strides.size()) throw py::value_error("sizes and strides differ in length");
    for (const int64_t s : e.sizes) {
      if (s < 0 && static_cast<size_t>(-s - 1) >= spec->ranges.size()) {
        throw py::value_error("a size names a symbol without a range");
      }
    }
    for (const int64_t s : e.strides) {
      if (s < kContiguous) throw py::value_error("a stride is fixed (>= 0) or -1 (row-major)");
    }
    spec->expected.push_back(std::move(e));
  }
  PyObject* self = PyType_GenericAlloc(ranged_check_type(), 0);
  if (self == nullptr) throw py::error_already_set();
  auto* object = reinterpret_cast<RangedCheck*>(self);
  object->vectorcall = check;
  object->spec = spec.release();
  return py::reinterpret_steal<py::object>(self);
}

}  // namespace

void add_ranged_input_check(py::module_& m) {
  if (PyType_Ready(ranged_check_type()) != 0) throw py::error_already_set();
  m.def("RangedInputCheck", &make_ranged_check, py::arg("specs"), py::arg("ranges"),
        "RangedInputCheck([(dtype, device, sizes, strides), ...], [(low, high), ...]): sizes >= 0 are\n"
        "fixed, -(k + 1) is size symbol k (bound by its first occurrence, in range k; high -1 is\n"
        "unbounded); strides >= 0 are fixed, -1 is the row-major stride at the call's sizes.");
}

}  // namespace opgen
