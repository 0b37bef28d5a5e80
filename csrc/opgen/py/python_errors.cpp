// C++ exceptions as Python ones (python_errors.h).
#include "opgen/py/python_errors.h"

#include <c10/util/Exception.h>

#include <new>
#include <string_view>

namespace opgen {

PyObject* raise_current(const std::string& prefix) {
  const auto set = [&](PyObject* type, std::string_view message) -> PyObject* {
    if (message.find_first_not_of(" \n") == std::string_view::npos) message = "a C++ exception with no message";
    PyErr_SetString(type, (prefix + std::string(message)).c_str());
    return nullptr;
  };
  try {
    throw;
  } catch (const PythonError&) {
    return nullptr;
  } catch (const c10::IndexError& e) {
    return set(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    return set(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    return set(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    return set(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::OutOfMemoryError& e) {
    return set(PyExc_MemoryError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    const std::string_view brief = e.what_without_backtrace();  // empty for some CUDA errors: then with the backtrace
    return set(PyExc_RuntimeError, brief.find_first_not_of(" \n") == std::string_view::npos ? e.what() : brief);
  } catch (const std::bad_alloc&) {
    return set(PyExc_MemoryError, "out of memory");
  } catch (const std::exception& e) {
    // torch's python_error: a Python exception raised under the kernel (a Python dispatch mode, a Python
    // kernel) that is still the interpreter's current one; its what() is empty until persisted.
    if (PyErr_Occurred() != nullptr) return nullptr;
    return set(PyExc_RuntimeError, e.what());
  } catch (...) {
    return set(PyExc_RuntimeError, "unknown C++ exception");
  }
}

}  // namespace opgen
