// `THUNKS` and `register_thunks`: the Python face of exec/thunk_registry.h. A capsule carries a
// module's exec::ThunkExport to another module, whose registry checks its ABI and adds its tables.
#include "opgen/module/thunks_py.h"

#include <stdexcept>
#include <string>

#include "opgen/exec/thunk_registry.h"

namespace py = pybind11;

namespace opgen {

namespace {

constexpr const char* kCapsuleName = "opgen.thunks";

std::string describe(py::handle object) {
  if (!PyCapsule_CheckExact(object.ptr()))
    return "an object of type " + std::string(Py_TYPE(object.ptr())->tp_name);
  const char* name = PyCapsule_GetName(object.ptr());
  if (name == nullptr) {
    PyErr_Clear();
    return "a capsule without a name";
  }
  return "a capsule named '" + std::string(name) + "'";
}

const char* register_thunks(const std::string& prefix, py::handle capsule) {
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName)) {
    throw py::value_error("register_thunks('" + prefix +
                          "'): expected an opgen extension's THUNKS (a capsule named '" +
                          kCapsuleName + "'), got " + describe(capsule));
  }
  const auto* other =
      static_cast<const exec::ThunkExport*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  try {
    switch (exec::register_thunks(prefix, *other)) {
      case exec::Registered::kAdded:
        return "added";
      case exec::Registered::kUnchanged:
        return "unchanged";
      case exec::Registered::kReplaced:
        return "replaced";
    }
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return "added";  // unreachable: every Registered is named above
}

}  // namespace

void add_thunks(py::module_& m) {
  const exec::ThunkExport& own = exec::own_thunks();
  // The export is a static of this module: the capsule needs no destructor.
  PyObject* capsule = PyCapsule_New(const_cast<exec::ThunkExport*>(&own), kCapsuleName, nullptr);
  if (capsule == nullptr) throw py::error_already_set();
  m.attr("THUNKS") = py::reinterpret_steal<py::object>(capsule);
  m.attr("THUNK_ABI") = own.abi;
  m.def("register_thunks", &register_thunks, py::arg("prefix"), py::arg("capsule"),
        "Let this module's C++ executor call another extension's thunks: kernel lines find each\n"
        "function `f` of its kernel_ops as `<prefix>f.<device>` (docs/cpp-program.md). `capsule`\n"
        "is that module's THUNKS. Returns 'added', 'unchanged' (the same thunks under this prefix\n"
        "again) or 'replaced' (other thunks under it: programs bound from now on call the new\n"
        "ones). ValueError for a prefix not of A-Z a-z 0-9 _, an object that is no THUNKS\n"
        "capsule, thunks built for another THUNK_ABI (another opgen or torch), or a name taken.");
  m.def(
      "registered_thunks",
      [] {
        py::dict out;
        for (const auto& [prefix, digest] : exec::registered_thunks())
          out[py::str(prefix)] = digest;
        return out;
      },
      "{prefix: thunk digest} of the extensions register_thunks added, in prefix order.");
}

}  // namespace opgen
