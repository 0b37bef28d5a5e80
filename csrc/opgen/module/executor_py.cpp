// The Python face of the C++ executor (executor.h): `_C.CppFunction`, a vectorcall object that
// checks its inputs as a generated Python function does (input_check.h's `matches`), hands a
// mismatch to the runtime's slow path, runs the program and wraps its results. It has a __dict__
// (for `report` and `artifact`) and takes part in cyclic GC (it holds Python callables that may
// refer back to it).
#include "opgen/module/executor_py.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "opgen/exec/executor.h"
#include "opgen/module/call_arguments.h"
#include "opgen/module/executor_externs.h"
#include "opgen/module/recycled.h"
#include "opgen/package/package.h"
#include "opgen/py/input_check.h"
#include "opgen/py/object_fields.h"
#include "opgen/py/python_errors.h"
#include "opgen/py/vectorcall_type.h"

namespace py = pybind11;

namespace opgen {

namespace {

// clang-format off
struct CppFunction {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* dict;
  PyObject* weakrefs;  // as a Python function's: caches may hold compiled functions weakly
  exec::Program* program;
  std::vector<ExpectedTensor>* expected;
  PyObject* handler;    // the slow path: handler(*args) returns a result, raises, or returns `proceed`
  PyObject* proceed;    // the sentinel that says: run this program on these inputs
  PyObject* unflatten;  // rebuilds a pytree result from the flat tuple (None unless the form is pytree)
  PyObject* check;      // check(*args) -> bool: the input check of a program with symbolic sizes
  PyObject* resolver;   // null, or resolver() -> None (not yet) or {choice: pick}, asked after calls
  PyObject* picks;      // what the resolver returned, once it did (else null)
  std::vector<std::unique_ptr<exec::Program>>* retired;  // programs `resolve` replaced
  std::vector<Kept>* kept;  // by return value (null: the program recycles none)
  int form;             // the return line's form, as a Form

  // The Python objects it holds, for the cyclic GC (object_fields.h).
  template <typename F>
  void for_each_object(F&& f) {
    for (PyObject** o : {&dict, &handler, &proceed, &unflatten, &check, &resolver, &picks}) f(*o);
    if (kept != nullptr) {
      for (Kept& k : *kept) f(k.object);
    }
  }
};
// clang-format on

PyObject* raise_current(const exec::Program& program) {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();  // the error goes back to Python as it came
    return nullptr;
  } catch (...) {
    return opgen::raise_current("opgen program " + program.name() + ": ");
  }
}

enum Form { kSingle, kTuple, kList, kPytree };

int form_of(const std::string& form) {
  if (form == "single") return kSingle;
  if (form == "tuple") return kTuple;
  if (form == "list") return kList;
  if (form == "pytree") return kPytree;
  throw py::value_error("unknown return form '" + form + "' (single, tuple, list or pytree)");
}

// The call's results as Python objects, in the return line's form. A result the program wrote into
// a lent object (a recycled one) is that object; any other is wrapped, and kept if recyclable.
PyObject* results_to_python(CppFunction& fn, exec::Results& results, Lent& lent) {
  c10::SmallVector<PyObject*, 4> taken = lent.take(results);
  const auto object = [&](size_t i) {
    if (taken[i] != nullptr) return std::exchange(taken[i], nullptr);
    PyObject* item = to_python(std::move(results[i]));
    keep(fn.kept, i, item);
    return item;
  };
  PyObject* out = nullptr;
  if (fn.form == kSingle) {
    out = object(0);
  } else {
    const bool as_list = fn.form == kList;
    const auto n = static_cast<Py_ssize_t>(results.size());
    out = as_list ? PyList_New(n) : PyTuple_New(n);
    for (size_t i = 0; out != nullptr && i < results.size(); ++i) {
      PyObject* item = object(i);
      if (item == nullptr)
        Py_CLEAR(out);
      else if (as_list)
        PyList_SET_ITEM(out, i, item);
      else
        PyTuple_SET_ITEM(out, i, item);
    }
    if (out != nullptr && fn.form == kPytree) {
      PyObject* tree = PyObject_CallOneArg(fn.unflatten, out);
      Py_DECREF(out);
      out = tree;
    }
  }
  for (PyObject* o : taken) Py_XDECREF(o);  // an error on the way left these
  return out;
}

// After a call: asks the resolver for the picks of the program's choices. Once it gives them, the
// program with each pick's lines in place of its choice's call runs from the next call on; the old
// one stays alive (a thread may still be in it) until the function is freed. False: a Python error.
bool resolve(CppFunction& fn) {
  PyObject* picks = PyObject_CallNoArgs(fn.resolver);
  if (picks == nullptr) return false;
  const py::object held = py::reinterpret_steal<py::object>(picks);
  if (picks == Py_None) return true;
  std::unordered_map<std::string, std::string> map;
  try {
    for (const auto& [name, pick] : py::cast<py::dict>(held))
      map[py::cast<std::string>(name)] = py::cast<std::string>(pick);
    std::unique_ptr<exec::Program> next = fn.program->resolved(map);
    fn.retired->emplace_back(fn.program);
    fn.program = next.release();
  } catch (...) {
    raise_current(*fn.program);
    return false;
  }
  Py_CLEAR(fn.resolver);
  fn.picks = held.inc_ref().ptr();
  return true;
}

// A call with one argument per input, in order.
PyObject* run_call(CppFunction& fn, PyObject* const* args, Py_ssize_t n) {
  const exec::Program& program = *fn.program;
  bool checked =
      false;  // every input is a plain tensor of the expected metadata (the guard passed)
  if (program.guarded()) {
    bool ok = !(program.grad_guard() && at::GradMode::is_enabled());
    if (ok && program.dynamic()) {  // ranges and equal sizes: the runtime's check
      PyObject* passed = PyObject_Vectorcall(fn.check, args, n, nullptr);
      if (passed == nullptr) return nullptr;
      ok = passed == Py_True;
      Py_DECREF(passed);
    } else {
      for (Py_ssize_t i = 0; ok && i < n; ++i) ok = matches(args[i], (*fn.expected)[i]);
    }
    checked = ok;
    if (!ok) {
      PyObject* result = PyObject_Vectorcall(fn.handler, args, n, nullptr);
      if (result == nullptr || result != fn.proceed) return result;
      Py_DECREF(result);
    }
  }
  try {
    exec::Registers regs = program.registers();
    exec::BorrowedInputs inputs(regs);  // no reference count change (see executor.h)
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (program.inputs()[i].opaque) continue;  // never read: its register stays None
      if (program.inputs()[i].is_size) {         // the check held it to an int in its range
        const long long v = PyLong_AsLongLong(args[i]);
        if (v == -1 && PyErr_Occurred()) return nullptr;
        inputs.set_size(static_cast<size_t>(i), v);
        continue;
      }
      if (!checked && !THPVariable_Check(args[i])) {
        return PyErr_Format(PyExc_TypeError, "%s(): argument %zd must be a Tensor, not %s",
                            program.name().c_str(), i + 1, Py_TYPE(args[i])->tp_name);
      }
      inputs.set(static_cast<size_t>(i), THPVariable_Unpack(args[i]));
    }
    Lent lent(fn.kept);  // dropped results to write into (`recycle` lines), with the GIL
    exec::Results results;
    if (program.releases_gil()) {
      PyThreadState* state = PyEval_SaveThread();
      try {
        const auto lock = program.lock();
        program.run(regs, results, lent.recycled);
      } catch (...) {
        PyEval_RestoreThread(state);
        throw;
      }
      PyEval_RestoreThread(state);
    } else {
      program.run(regs, results, lent.recycled);  // with the GIL held, calls run one at a time
    }
    PyObject* out = results_to_python(fn, results, lent);
    if (out != nullptr && fn.resolver != nullptr && !resolve(fn)) Py_CLEAR(out);
    return out;
  } catch (...) {
    return raise_current(program);
  }
}

PyObject* call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto& fn = *reinterpret_cast<CppFunction*>(self);
  const exec::Program& program = *fn.program;
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (C10_UNLIKELY(kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    c10::SmallVector<PyObject*, 8> bound;
    if (!bind_keywords(program, args, n, kwnames, bound)) return nullptr;
    return run_call(fn, bound.data(), static_cast<Py_ssize_t>(bound.size()));
  }
  if (n != static_cast<Py_ssize_t>(program.inputs().size())) return arity_error(program, n);
  return run_call(fn, args, n);
}

void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  if (reinterpret_cast<CppFunction*>(self)->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  clear_objects<CppFunction>(self);
  auto* fn = reinterpret_cast<CppFunction*>(self);
  delete fn->program;
  delete fn->retired;
  delete fn->kept;
  delete fn->expected;
  Py_TYPE(self)->tp_free(self);
}

PyObject* program_text_names(PyObject* self, void*) {
  const auto& program = *reinterpret_cast<CppFunction*>(self)->program;
  return PyUnicode_FromString(program.name().c_str());
}

PyObject* picks_of(PyObject* self, void*) {
  PyObject* picks = reinterpret_cast<CppFunction*>(self)->picks;
  if (picks == nullptr) Py_RETURN_NONE;
  Py_INCREF(picks);
  return picks;
}

// inspect.signature(fn): one parameter per input, as the generated Python function has.
PyObject* signature_of(PyObject* self, void*) {
  const auto& program = *reinterpret_cast<CppFunction*>(self)->program;
  try {
    const py::module_ inspect = py::module_::import("inspect");
    const py::object parameter = inspect.attr("Parameter");
    py::list parameters;
    for (const exec::InputSpec& input : program.inputs())
      parameters.append(parameter(input.name, parameter.attr("POSITIONAL_OR_KEYWORD")));
    return inspect.attr("Signature")(parameters).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  }
}

PyGetSetDef getset[] = {
    {"__name__", program_text_names, nullptr, "the program's name", nullptr},
    {"__signature__", signature_of, nullptr, "one parameter per input", nullptr},
    {"picks", picks_of, nullptr,
     "{choice: pick} the program runs resolved with (fused kernels: 'triton' or 'aten'), or None",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject* cpp_function_type() {
  static PyTypeObject type = vectorcall_type<CppFunction>(
      "opgen._C.CppFunction",
      "A compiled graph run by opgen's C++ executor (opgen.runtime.codegen.cpp).",
      {dealloc, traverse_objects<CppFunction>, clear_objects<CppFunction>, nullptr, getset,
       offsetof(CppFunction, dict), offsetof(CppFunction, weakrefs), copied_as_itself()});
  return &type;
}

std::vector<at::Tensor> tensors_of(const py::sequence& constants, const char* where) {
  std::vector<at::Tensor> tensors;
  for (const py::handle item : constants) {
    if (!THPVariable_Check(item.ptr()))
      throw py::type_error(std::string(where) + "(): constants must be tensors");
    tensors.push_back(THPVariable_Unpack(item.ptr()));
  }
  return tensors;
}

py::object make_cpp_function(const std::string& text, const py::sequence& constants,
                             const py::dict& externs, const py::object& handler,
                             const py::object& proceed, const py::object& unflatten,
                             const py::object& resolver, const py::object& check) {
  std::unique_ptr<exec::Program> program = exec::Program::parse(text);
  if (program->dynamic() && program->guarded() && check.is_none()) {
    throw py::value_error("a program with symbolic input sizes needs its input check");
  }
  // The Python function's setup values of the same names (its closure, which `externs` is), so
  // that packing and folding run once.
  std::vector<std::pair<int32_t, c10::IValue>> given;
  for (const auto& [k, name] : program->shared()) {
    PyObject* value = PyDict_GetItemString(externs.ptr(), name.c_str());
    if (value != nullptr && THPVariable_Check(value))
      given.emplace_back(k, THPVariable_Unpack(value));
  }
  program->bind(tensors_of(constants, "cpp_function"), externs_of(*program, externs), false, given);
  auto expected = std::make_unique<std::vector<ExpectedTensor>>();
  for (const exec::InputSpec& spec : program->inputs()) {
    expected->push_back({spec.dtype, spec.device, spec.sizes, spec.strides});
  }
  const int form = form_of(program->return_form());
  if (form == kPytree && unflatten.is_none()) {
    throw py::value_error("a program returning a pytree needs its unflatten function");
  }
  PyObject* self = PyType_GenericAlloc(cpp_function_type(), 0);
  if (self == nullptr) throw py::error_already_set();
  auto* fn = reinterpret_cast<CppFunction*>(self);
  fn->vectorcall = call;
  fn->dict = nullptr;
  fn->weakrefs = nullptr;
  fn->program = program.release();
  fn->expected = expected.release();
  fn->handler = py::object(handler).release().ptr();
  fn->proceed = py::object(proceed).release().ptr();
  fn->unflatten = py::object(unflatten).release().ptr();
  fn->check = py::object(check).release().ptr();
  fn->resolver = resolver.is_none() ? nullptr : py::object(resolver).release().ptr();
  fn->picks = nullptr;
  fn->retired = new std::vector<std::unique_ptr<exec::Program>>();
  fn->kept = nullptr;
  if (!fn->program->recyclable().empty()) {
    const auto& slots = fn->program->recyclable();
    fn->kept = new std::vector<Kept>(*std::max_element(slots.begin(), slots.end()) + 1);
    for (int32_t k : slots) (*fn->kept)[k].on = true;
  }
  fn->form = form;
  return py::reinterpret_steal<py::object>(self);
}

// `read_package(path)`: package.h's reader, for opgen.load_package; PackageError as opgen's.
py::dict read_package_py(const std::string& path) {
  PackageContents c;
  try {
    c = read_package(path);
  } catch (const PackageError& e) {
    PyErr_SetString(opgen_error("PackageError", PyExc_RuntimeError), e.what());
    throw py::error_already_set();
  }
  py::list constants;
  for (at::Tensor& t : c.constants)
    constants.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))));
  py::dict out;
  out["name"] = c.name;
  out["torch_version"] = c.torch_version;
  out["thunk_digest"] = c.thunk_digest;
  out["kernel_ops_build_id"] = c.kernel_ops_build_id;
  out["program"] = c.program;
  py::list keys;
  for (const std::string& key : c.constant_keys) keys.append(key);
  out["constant_keys"] = keys;
  out["constants"] = constants;
  out["output_form"] = c.output_form;
  out["output_tree"] = c.output_tree;
  return out;
}

// `setup_values(text, constants)`: the program's named statics once its setup has run (tensors;
// None for anything else), for packaging's setup folding (opgen.runtime.artifact.setup_folding).
py::list setup_values(const std::string& text, const py::sequence& constants) {
  std::unique_ptr<exec::Program> program = exec::Program::parse(text);
  program->bind(tensors_of(constants, "setup_values"), {}, /*keep_setup_values=*/true);
  py::list out;
  for (const c10::IValue& v : program->named_statics()) {
    if (v.isTensor()) {
      out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor())));
    } else {
      out.append(py::none());
    }
  }
  return out;
}

}  // namespace

void add_executor(py::module_& m) {
  if (PyType_Ready(cpp_function_type()) != 0) throw py::error_already_set();
  m.def("cpp_function", &make_cpp_function, py::arg("text"), py::arg("constants"),
        py::arg("externs"), py::arg("handler"), py::arg("proceed"), py::arg("unflatten"),
        py::arg("resolver") = py::none(), py::arg("check") = py::none(),
        "Parse an executor program (opgen.runtime.codegen.cpp), bind its constants and externs "
        "(name -> callable)\nand run its setup; returns the CppFunction that runs it. ValueError "
        "on a malformed program, a kernel\nwithout a thunk or an extern without a function. "
        "`resolver() -> None | {choice: pick}` is asked\nafter each call until it names the "
        "picks; the program then runs with them resolved (Program::resolved). `check(*args) -> "
        "bool` is the\ninput check of a program with symbolic input sizes.");
  m.def("setup_values", &setup_values, py::arg("text"), py::arg("constants"),
        "Parse and bind an executor program; its named statics (s0...) once setup has run: "
        "tensors, None for other values.");
  m.def(
      "reprint_program",
      [](const std::string& text) { return exec::print_program(*exec::Program::parse(text)); },
      py::arg("text"),
      "Parse an executor program and print the parsed program back (docs/cpp-program.md): the\n"
      "printer's text again, less its whole-line comments. ValueError on a malformed program.");
  m.def("read_package", &read_package_py, py::arg("path"),
        "Read and check an opgen package (csrc/opgen/package/package.h): a dict of its program, "
        "constants and versions.\nopgen.runtime.errors.PackageError on anything wrong with "
        "the file.");
  m.def(
      "crc32c",
      [](const py::buffer& data) {
        const py::buffer_info info = data.request();
        return crc32c(info.ptr, static_cast<size_t>(info.size * info.itemsize));
      },
      py::arg("data"), "CRC-32C of a buffer's bytes: the checksum of package files (package.h).");
  m.attr("THUNK_DIGEST") = thunk_digest();
  m.attr("PACKAGE_FORMAT") = kPackageFormat;
}

}  // namespace opgen
