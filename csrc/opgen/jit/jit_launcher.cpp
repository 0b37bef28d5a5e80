// The JIT launcher (CUDA builds): loads Triton binaries once per device and launches them with no
// Python between the caller and cuLaunchKernel. See jit.h for the model, opgen/jit/ for the rest.
#include "opgen/jit/jit.h"

#include "opgen/bind/binding.h"
#include "opgen/jit/jit_binding.h"
#include "opgen/py/object_fields.h"
#include "opgen/py/vectorcall_type.h"

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <dlfcn.h>
#include <structmember.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace opgen::jit {
namespace {

// The CUDA driver, opened with dlopen as Triton does: a CUDA build of opgen still imports where
// there is no driver, and only JIT use needs it.
struct Driver {
  decltype(&::cuModuleLoadData) moduleLoadData = nullptr;
  decltype(&::cuModuleGetFunction) moduleGetFunction = nullptr;
  decltype(&::cuModuleUnload) moduleUnload = nullptr;
  decltype(&::cuFuncSetAttribute) funcSetAttribute = nullptr;
  decltype(&::cuFuncGetAttribute) funcGetAttribute = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuLaunchKernel) launchKernel = nullptr;
  decltype(&::cuLaunchKernelEx) launchKernelEx = nullptr;  // null where the driver lacks it (before CUDA 11.8)
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuDriverGetVersion) driverGetVersion = nullptr;
  decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
  decltype(&::cuCtxSetCurrent) ctxSetCurrent = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) devicePrimaryCtxRetain = nullptr;
};

template <class F>
void resolve(void* lib, const char* name, F& slot) {
  slot = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(slot != nullptr, "opgen.jit: libcuda.so.1 has no ", name);
}

const Driver& driver() {
  static const Driver d = [] {
    // Local, as Triton opens it: the symbols are taken from the handle, and a global libcuda would join the
    // scope every later symbol lookup in the process searches.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib != nullptr, "opgen.jit: cannot open the CUDA driver (libcuda.so.1): ", dlerror());
    Driver out;
    resolve(lib, "cuModuleLoadData", out.moduleLoadData);
    resolve(lib, "cuModuleGetFunction", out.moduleGetFunction);
    resolve(lib, "cuModuleUnload", out.moduleUnload);
    resolve(lib, "cuFuncSetAttribute", out.funcSetAttribute);
    resolve(lib, "cuFuncGetAttribute", out.funcGetAttribute);
    resolve(lib, "cuDeviceGetAttribute", out.deviceGetAttribute);
    resolve(lib, "cuLaunchKernel", out.launchKernel);
    out.launchKernelEx = reinterpret_cast<decltype(&::cuLaunchKernelEx)>(dlsym(lib, "cuLaunchKernelEx"));
    resolve(lib, "cuGetErrorString", out.getErrorString);
    resolve(lib, "cuDriverGetVersion", out.driverGetVersion);
    resolve(lib, "cuCtxGetCurrent", out.ctxGetCurrent);
    resolve(lib, "cuCtxSetCurrent", out.ctxSetCurrent);
    resolve(lib, "cuDeviceGet", out.deviceGet);
    resolve(lib, "cuDevicePrimaryCtxRetain", out.devicePrimaryCtxRetain);
    return out;
  }();
  return d;
}

void check(CUresult result, const char* what, const std::string& kernel) {
  if (result == CUDA_SUCCESS) return;
  const char* message = nullptr;
  driver().getErrorString(result, &message);
  TORCH_CHECK(false, "opgen.jit: ", what, " failed for kernel ", kernel, ": ",
              message != nullptr ? message : "unknown CUDA error", " (CUresult ", static_cast<int>(result), ")");
}

// The driver API needs a current context, and a thread that has made no CUDA runtime call yet has none:
// a new Python thread whose first kernel is a JIT one, its output taken from the allocator's cache.
// Launching there crashed in the driver. Binds the device's primary context (the runtime's), as
// Triton's own launcher does; checked once a thread (a device switch goes through the runtime, which
// binds the other device's context).
void ensure_context(int device) {
  thread_local bool checked = false;
  if (checked) return;
  const Driver& d = driver();
  CUcontext current = nullptr;
  check(d.ctxGetCurrent(&current), "cuCtxGetCurrent", "-");
  if (current == nullptr) {
    CUdevice dev = 0;
    check(d.deviceGet(&dev, device), "cuDeviceGet", "-");
    CUcontext primary = nullptr;
    check(d.devicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain", "-");
    check(d.ctxSetCurrent(primary), "cuCtxSetCurrent", "-");
  }
  checked = true;
}

// How one runtime parameter of a variant takes its argument.
enum class Kind : uint8_t { Ptr, I32, I64, U64, F32, F64, U1, ConstOne, ConstNone };

struct Param {
  Kind kind;
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // Ptr: the element type compiled for
  bool align16 = false;                                // Ptr: compiled for 16-byte aligned data
  bool div16 = false;                                  // ints: compiled for multiples of 16
};

// Opcodes of grid programs (opgen/jit/expr.py).
enum Op : int64_t { CONST, ARG, NUMEL, SIZE, STRIDE, ADD, SUB, MUL, FLOORDIV, MAX, MIN, NEG };

constexpr int kMaxDevices = 64;

struct Variant {
  std::string name;  // entry point
  std::string binary;
  unsigned num_warps = 4;
  unsigned shared = 0;
  int extra_pointers = 0;  // trailing null pointers the ABI wants (Triton's scratch buffers)
  bool dependent = false;  // launched to start while the kernel before it finishes (it waits with gdc_wait)
  std::vector<Param> params;
  std::vector<std::vector<int64_t>> grid;  // one program per dimension; empty when `py_grid` is set
  py::object py_grid;                      // grid(*args) -> tuple of ints, where the grid is not traceable
  // Read without a lock (and without the GIL, from the C++ executor); written once, under load_mutex.
  std::array<std::atomic<CUfunction>, kMaxDevices> functions{};
  std::array<CUmodule, kMaxDevices> modules{};
  std::mutex load_mutex;

  ~Variant() {
    for (CUmodule m : modules) {
      if (m != nullptr) driver().moduleUnload(m);  // errors at shutdown are ignored
    }
  }
};

// Loads the binary into `device`'s context (once) and returns the function.
CUfunction function_for(Variant& v, int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "opgen.jit: device index ", device, " out of range");
  if (CUfunction f = v.functions[device].load(std::memory_order_acquire)) return f;
  std::lock_guard<std::mutex> lock(v.load_mutex);
  if (CUfunction f = v.functions[device].load(std::memory_order_relaxed)) return f;
  const Driver& d = driver();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ensure_context(device);
  CUmodule module = nullptr;
  check(d.moduleLoadData(&module, v.binary.data()), "cuModuleLoadData", v.name);
  CUfunction f = nullptr;
  check(d.moduleGetFunction(&f, module, v.name.c_str()), "cuModuleGetFunction", v.name);
  int optin = 0;
  check(d.deviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device),
        "cuDeviceGetAttribute", v.name);
  // opgen.jit refuses such binaries before they get here (kernels.check_fits): this is the last guard.
  TORCH_CHECK(v.shared <= static_cast<unsigned>(optin), "opgen.jit: kernel ", v.name, " needs ", v.shared,
              " bytes of shared memory; the device allows ", optin, ". Smaller blocks or fewer num_stages may help.");
  if (v.shared > 49152) {
    int static_shared = 0;
    check(d.funcGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f), "cuFuncGetAttribute", v.name);
    check(d.funcSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - static_shared),
          "cuFuncSetAttribute", v.name);
  }
  v.modules[device] = module;
  v.functions[device].store(f, std::memory_order_release);
  return f;
}

bool is_aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// Does this variant's specialization hold for these arguments?
bool fits(const Variant& v, const Arg* args, size_t n) {
  if (v.params.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    const Param& p = v.params[i];
    const Arg& a = args[i];
    switch (p.kind) {
      case Kind::Ptr:
        if (a.kind != Arg::Kind::Tensor || !a.tensor->defined() || a.tensor->scalar_type() != p.dtype) return false;
        if (p.align16 && !is_aligned(*a.tensor)) return false;
        break;
      case Kind::I32:
        if (a.kind != Arg::Kind::Int || a.i < std::numeric_limits<int32_t>::min() ||
            a.i > std::numeric_limits<int32_t>::max() || (p.div16 && a.i % 16 != 0))
          return false;
        break;
      case Kind::I64:
      case Kind::U64:
        if (a.kind != Arg::Kind::Int || (p.div16 && a.i % 16 != 0)) return false;
        break;
      case Kind::F32:
      case Kind::F64:
        if (a.kind != Arg::Kind::Float) return false;
        break;
      case Kind::U1:
        if (a.kind != Arg::Kind::Bool) return false;
        break;
      case Kind::ConstOne:
        if (a.kind != Arg::Kind::Int || a.i != 1) return false;
        break;
      case Kind::ConstNone:
        if (a.kind != Arg::Kind::None) return false;
        break;
    }
  }
  return true;
}

int64_t eval_program(const std::vector<int64_t>& prog, const Arg* args) {
  int64_t stack[32];
  int top = 0;
  const size_t n = prog.size();
  for (size_t pc = 0; pc < n;) {
    switch (prog[pc]) {
      case CONST: stack[top++] = prog[pc + 1]; pc += 2; break;
      case ARG: stack[top++] = args[prog[pc + 1]].i; pc += 2; break;
      case NUMEL: stack[top++] = args[prog[pc + 1]].tensor->numel(); pc += 2; break;
      case SIZE: stack[top++] = args[prog[pc + 1]].tensor->size(prog[pc + 2]); pc += 3; break;
      case STRIDE: stack[top++] = args[prog[pc + 1]].tensor->stride(prog[pc + 2]); pc += 3; break;
      case NEG: stack[top - 1] = -stack[top - 1]; pc += 1; break;
      default: {
        const int64_t b = stack[--top];
        int64_t& a = stack[top - 1];
        switch (prog[pc]) {
          case ADD: a += b; break;
          case SUB: a -= b; break;
          case MUL: a *= b; break;
          case FLOORDIV: a = floordiv(a, b); break;
          case MAX: a = std::max(a, b); break;
          case MIN: a = std::min(a, b); break;
        }
        pc += 1;
      }
    }
  }
  return stack[0];
}

PyObject* wrap_arg(const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::Tensor: return THPVariable_Wrap(*a.tensor);
    case Arg::Kind::Int: return PyLong_FromLongLong(a.i);
    case Arg::Kind::Float: return PyFloat_FromDouble(a.f);
    case Arg::Kind::Bool: return PyBool_FromLong(static_cast<long>(a.i));
    case Arg::Kind::None: break;
  }
  Py_RETURN_NONE;
}

// The grid of a variant whose grid is a Python function.
std::array<int64_t, 3> py_grid(const Variant& v, const Arg* args, size_t n) {
  py::tuple call_args(n);
  for (size_t i = 0; i < n; ++i) {
    PyObject* o = wrap_arg(args[i]);
    if (o == nullptr) throw py::error_already_set();
    call_args[i] = py::reinterpret_steal<py::object>(o);
  }
  const py::tuple g = v.py_grid(*call_args).cast<py::tuple>();
  TORCH_CHECK_VALUE(g.size() >= 1 && g.size() <= 3, "opgen.jit: the grid of ", v.name,
                    " must have 1 to 3 dimensions, got ", g.size());
  std::array<int64_t, 3> out{1, 1, 1};
  for (size_t i = 0; i < g.size(); ++i) out[i] = g[i].cast<int64_t>();
  return out;
}

// Argument slots: on the stack and left uninitialised (every slot used is written) for the common
// case, on the heap for kernels with more than 64 parameters.
struct Packed {
  std::array<uint64_t, 64> storage;
  std::array<void*, 64> pointers;
  std::vector<uint64_t> big_storage;
  std::vector<void*> big_pointers;
  void** data = nullptr;
};

template <class T>
void put(uint64_t* slot, T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  std::memcpy(slot, &value, sizeof(T));
}

void pack(const Variant& v, const Arg* args, size_t n, Packed& out) {
  const size_t total = n + static_cast<size_t>(v.extra_pointers);
  uint64_t* storage = out.storage.data();
  void** pointers = out.pointers.data();
  if (total > out.storage.size()) {
    out.big_storage.assign(total, 0);
    out.big_pointers.assign(total, nullptr);
    storage = out.big_storage.data();
    pointers = out.big_pointers.data();
  }
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const Arg& a = args[i];
    uint64_t* slot = &storage[k];
    switch (v.params[i].kind) {
      case Kind::Ptr: put(slot, reinterpret_cast<uint64_t>(a.tensor->data_ptr())); break;
      case Kind::I32: put(slot, static_cast<int32_t>(a.i)); break;
      case Kind::I64: put(slot, a.i); break;
      case Kind::U64: put(slot, static_cast<uint64_t>(a.i)); break;
      case Kind::F32: put(slot, static_cast<float>(a.f)); break;
      case Kind::F64: put(slot, a.f); break;
      case Kind::U1: put(slot, static_cast<uint8_t>(a.i)); break;
      case Kind::ConstOne:
      case Kind::ConstNone: continue;  // baked into the binary: not a kernel parameter
    }
    pointers[k] = slot;
    ++k;
  }
  for (int e = 0; e < v.extra_pointers; ++e) {
    put(&storage[k], uint64_t{0});
    pointers[k] = &storage[k];
    ++k;
  }
  out.data = pointers;
}

int device_of(const Arg* args, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (args[i].kind == Arg::Kind::Tensor) return args[i].tensor->get_device();
  }
  return c10::cuda::current_device();
}

struct Grid {
  unsigned x, y, z;
  bool empty;
};

Grid grid_of(const Variant& v, const Arg* args, size_t n) {
  std::array<int64_t, 3> g{1, 1, 1};
  if (v.py_grid) {
    g = py_grid(v, args, n);
  } else {
    for (size_t d = 0; d < v.grid.size(); ++d) g[d] = eval_program(v.grid[d], args);
  }
  if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0) return {0, 0, 0, true};
  TORCH_CHECK_VALUE(g[0] < (int64_t{1} << 31) && g[1] < 65536 && g[2] < 65536, "opgen.jit: grid (", g[0], ", ",
                    g[1], ", ", g[2], ") of ", v.name, " is larger than CUDA allows");
  return {static_cast<unsigned>(g[0]), static_cast<unsigned>(g[1]), static_cast<unsigned>(g[2]), false};
}

void launch_variant(Variant& v, const Arg* args, size_t n) {
  const Grid grid = grid_of(v, args, n);
  if (grid.empty) return;
  const int device = device_of(args, n);
  CUfunction f = function_for(v, device);
  Packed packed;
  pack(v, args, n, packed);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  const bool switch_device = c10::cuda::current_device() != device;
  std::optional<c10::cuda::CUDAGuard> guard;
  if (switch_device) guard.emplace(static_cast<c10::DeviceIndex>(device));
  ensure_context(device);
  const Driver& d = driver();
  if (v.dependent && d.launchKernelEx != nullptr) {
    // Programmatic dependent launch: the kernel may start once every program of the kernel before it
    // has started (or signalled, gdc_launch_dependents); its own gdc_wait holds it until that kernel
    // has finished and its writes are visible. Captured into CUDA graphs as a programmatic edge.
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid.x;
    config.gridDimY = grid.y;
    config.gridDimZ = grid.z;
    config.blockDimX = 32 * v.num_warps;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = v.shared;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(d.launchKernelEx(&config, f, packed.data, nullptr), "cuLaunchKernelEx", v.name);
    return;
  }
  check(d.launchKernel(f, grid.x, grid.y, grid.z, 32 * v.num_warps, 1, 1, v.shared, stream, packed.data, nullptr),
        "cuLaunchKernel", v.name);
}

// A launcher's compiled variants, in the order pick() tries them. The C++ executor walks them without the GIL (launch_with)
// while a first call on another thread adds one (with the GIL, add_variant). So a list is never
// changed once published: adding a variant publishes a new list, and every list stays until the
// launcher dies, since a reader may still be walking an older one. Variants are few (one per
// specialization a kernel meets), and so are the lists.
class Variants {
 public:
  using List = std::vector<std::shared_ptr<Variant>>;

  Variants() { publish(List{}); }
  const List& current() const { return *current_.load(std::memory_order_acquire); }
  // With the GIL held: writers take turns.
  void add(std::shared_ptr<Variant> v, bool first) {
    List next = current();
    next.insert(first ? next.begin() : next.end(), std::move(v));
    publish(std::move(next));
  }

 private:
  void publish(List list) {
    published_.push_back(std::make_unique<const List>(std::move(list)));
    current_.store(published_.back().get(), std::memory_order_release);
  }

  std::atomic<const List*> current_{nullptr};
  std::vector<std::unique_ptr<const List>> published_;
};

// The pybind11 entry points below raise as the rest of opgen does (python_errors.h: a C++ exception as the
// Python one, its message without c10's backtrace) instead of leaving C++ exceptions to pybind11's
// translators; pybind11's own exceptions pass as they are. (A c10 error thrown from jit_launch_strict once took
// the process down on the GPU machine: its toolchain had linked a second libstdc++ into the extension, and
// formatting the message crashed. opgen.cmake's _opgen_one_cxx_runtime links the one torch loads.)
template <class Body>
decltype(auto) python_errors(Body&& body) {
  try {
    return body();
  } catch (const py::error_already_set&) {
    throw;
  } catch (const py::builtin_exception&) {
    throw;
  } catch (...) {
    raise_current("");
    throw py::error_already_set();
  }
}

// --- the Python type ---------------------------------------------------------------------------------

struct Launcher {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fallback;  // fallback(*args): compile what fits, launch, return None
  PyObject* dict;
  Variants* variants;
  Py_ssize_t nargs;
  std::string* name;

  // The Python objects it holds, for the cyclic GC (object_fields.h).
  template <typename F>
  void for_each_object(F&& f) {
    f(fallback);
    f(dict);
  }
};

PyTypeObject* launcher_type();

// First variant whose specialization holds, or null.
Variant* pick(Launcher* self, const Arg* args, size_t n) {
  for (const auto& v : self->variants->current()) {
    if (fits(*v, args, n)) return v.get();
  }
  return nullptr;
}

[[noreturn]] void arg_error(PyObject* type, Launcher* self, Py_ssize_t i, const std::string& what) {
  PyErr_Format(type, "opgen.jit: %s: argument %zd %s", self->name->c_str(), i, what.c_str());
  throw PythonError{};
}

// Python objects -> Args. Tensors stay borrowed from the caller's objects.
void unpack(Launcher* self, PyObject* const* args, Py_ssize_t n, Arg* out) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = args[i];
    if (THPVariable_Check(o)) {
      const at::Tensor& t = THPVariable_Unpack(o);
      if (!t.is_cuda()) arg_error(PyExc_ValueError, self, i, "is a tensor on " + t.device().str() + ", expected CUDA");
      out[i] = tensor_arg(t);
    } else if (PyBool_Check(o)) {
      out[i] = bool_arg(o == Py_True);
    } else if (PyLong_Check(o)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow != 0) arg_error(PyExc_OverflowError, self, i, "does not fit in 64 bits");
      out[i] = int_arg(v);
    } else if (PyFloat_Check(o)) {
      out[i] = float_arg(PyFloat_AS_DOUBLE(o));
    } else if (o == Py_None) {
      out[i] = none_arg();
    } else {
      arg_error(PyExc_TypeError, self, i, std::string("has type ") + Py_TYPE(o)->tp_name +
                                                  " (expected a CUDA tensor, int, float, bool or None)");
    }
  }
}

PyObject* call_fallback(Launcher* self, PyObject* const* args, size_t nargsf) {
  if (self->fallback == nullptr || self->fallback == Py_None) {
    PyErr_Format(PyExc_RuntimeError, "opgen.jit: %s: no compiled variant fits these arguments", self->name->c_str());
    return nullptr;
  }
  return PyObject_Vectorcall(self->fallback, args, nargsf, nullptr);
}

PyObject* call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  auto* self = reinterpret_cast<Launcher*>(obj);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
    PyErr_Format(PyExc_TypeError, "opgen.jit: %s takes its arguments by position only", self->name->c_str());
    return nullptr;
  }
  if (n != self->nargs) {
    PyErr_Format(PyExc_TypeError, "opgen.jit: %s takes %zd arguments (the kernel's runtime parameters), got %zd",
                 self->name->c_str(), self->nargs, n);
    return nullptr;
  }
  std::array<Arg, 64> small;  // uninitialised: unpack() writes every element used
  std::vector<Arg> big;
  Arg* unpacked = small.data();
  if (n > static_cast<Py_ssize_t>(small.size())) {
    big.resize(n);
    unpacked = big.data();
  }
  try {
    unpack(self, args, n, unpacked);
  } catch (const PythonError&) {
    return nullptr;
  }
  if (Variant* v = pick(self, unpacked, n)) {
    launch_variant(*v, unpacked, n);
    Py_RETURN_NONE;
  }
  return call_fallback(self, args, nargsf);
  END_HANDLE_TH_ERRORS
}

}  // namespace

bool is_launcher(PyObject* o) { return PyObject_TypeCheck(o, launcher_type()) != 0; }

void launch_with(PyObject* obj, const Arg* args, size_t n) {
  auto* self = reinterpret_cast<Launcher*>(obj);
  TORCH_CHECK_TYPE(static_cast<Py_ssize_t>(n) == self->nargs, "opgen.jit: ", *self->name, " takes ", self->nargs,
                   " arguments (the kernel's runtime parameters), got ", n);
  if (Variant* v = pick(self, args, n)) {
    std::optional<py::gil_scoped_acquire> gil;
    if (v->py_grid) gil.emplace();  // the grid is a Python function
    launch_variant(*v, args, n);
    return;
  }
  py::gil_scoped_acquire gil;
  std::vector<py::object> wrapped;
  std::vector<PyObject*> raw;
  for (size_t i = 0; i < n; ++i) {
    PyObject* o = wrap_arg(args[i]);
    if (o == nullptr) throw PythonError{};
    wrapped.push_back(py::reinterpret_steal<py::object>(o));
    raw.push_back(o);
  }
  PyObject* result = call_fallback(self, raw.data(), n);
  if (result == nullptr) throw PythonError{};
  Py_DECREF(result);
}

namespace {

Kind kind_of(const std::string& k) {
  static const std::pair<const char*, Kind> kinds[] = {
      {"ptr", Kind::Ptr}, {"i32", Kind::I32}, {"i64", Kind::I64}, {"u64", Kind::U64}, {"fp32", Kind::F32},
      {"fp64", Kind::F64}, {"u1", Kind::U1}, {"const_one", Kind::ConstOne}, {"const_none", Kind::ConstNone}};
  for (const auto& [name, kind] : kinds) {
    if (k == name) return kind;
  }
  throw py::value_error("opgen.jit: unknown parameter kind '" + k + "'");
}

// add_variant(binary, name, num_warps, shared, params, grid, extra_pointers, first=True, dependent=False)
//   params: [(kind, dtype or None, align16, div16)]   grid: [program, ...] or a callable
void add_variant(py::object self_obj, py::bytes binary, std::string name, unsigned num_warps, unsigned shared,
                 py::list params, py::object grid, int extra_pointers, bool first, bool dependent) {
  if (!PyObject_TypeCheck(self_obj.ptr(), launcher_type())) throw py::type_error("add_variant: not a JitLauncher");
  auto* self = reinterpret_cast<Launcher*>(self_obj.ptr());
  auto v = std::make_shared<Variant>();
  v->name = std::move(name);
  v->binary = binary;
  v->num_warps = num_warps;
  v->shared = shared;
  v->extra_pointers = extra_pointers;
  v->dependent = dependent;
  for (const py::handle item : params) {
    const auto spec = item.cast<py::tuple>();
    Param p{kind_of(spec[0].cast<std::string>())};
    if (!spec[1].is_none()) p.dtype = spec[1].cast<c10::ScalarType>();
    p.align16 = spec[2].cast<bool>();
    p.div16 = spec[3].cast<bool>();
    v->params.push_back(p);
  }
  if (static_cast<Py_ssize_t>(v->params.size()) != self->nargs) {
    throw py::value_error("add_variant: " + std::to_string(v->params.size()) + " parameters for a launcher of " +
                          std::to_string(self->nargs));
  }
  if (PyCallable_Check(grid.ptr())) {
    v->py_grid = grid;
  } else {
    for (const py::handle program : grid) {
      auto prog = program.cast<std::vector<int64_t>>();
      TORCH_CHECK_VALUE(!prog.empty() && prog.size() < 64, "add_variant: bad grid program");
      v->grid.push_back(std::move(prog));
    }
    TORCH_CHECK_VALUE(!v->grid.empty() && v->grid.size() <= 3, "add_variant: a grid has 1 to 3 dimensions");
  }
  self->variants->add(std::move(v), first);
}

// A launcher's arguments from a module function (`fn(launcher, *args)`), unpacked, and the first
// variant that fits them (null when none does). The Args borrow from `args`, which must outlive them.
struct Fitted {
  Launcher* self;
  std::vector<Arg> args;
  Variant* variant;
};

Fitted fitted(const py::object& self_obj, const py::args& args) {
  if (!PyObject_TypeCheck(self_obj.ptr(), launcher_type())) throw py::type_error("not a JitLauncher");
  auto* self = reinterpret_cast<Launcher*>(self_obj.ptr());
  const Py_ssize_t n = static_cast<Py_ssize_t>(args.size());
  TORCH_CHECK_TYPE(n == self->nargs, "opgen.jit: ", *self->name, " takes ", self->nargs, " arguments, got ", n);
  std::vector<PyObject*> raw;
  for (const py::handle a : args) raw.push_back(a.ptr());
  std::vector<Arg> unpacked(n);
  try {
    unpack(self, raw.data(), n, unpacked.data());
  } catch (const PythonError&) {
    throw py::error_already_set();
  }
  Variant* v = pick(self, unpacked.data(), n);
  return {self, std::move(unpacked), v};
}

// Launches the first variant that fits, never the fallback: the fallback's own launch after it
// compiled one (a variant that does not fit the arguments it was compiled for is a bug).
void launch_strict(py::object self_obj, py::args args) {
  Fitted f = fitted(self_obj, args);
  TORCH_CHECK(f.variant != nullptr, "opgen.jit: ", *f.self->name, ": the variant just compiled does not fit its ",
              "own arguments (a specialization mismatch; please report it)");
  launch_variant(*f.variant, f.args.data(), f.args.size());
}

// Host time per launch of a loop of bare cuLaunchKernel calls with the arguments packed once: the
// floor any launcher can reach (opgen.bench jit compares against it).
double bench_bare(py::object self_obj, int64_t iterations, py::args args) {
  Fitted fit = fitted(self_obj, args);
  Variant* v = fit.variant;
  const size_t n = fit.args.size();
  TORCH_CHECK_VALUE(v != nullptr, "bench_bare: no compiled variant fits; call the launcher once first");
  const Grid grid = grid_of(*v, fit.args.data(), n);
  const int device = device_of(fit.args.data(), n);
  CUfunction f = function_for(*v, device);
  Packed packed;
  pack(*v, fit.args.data(), n, packed);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  const auto launch = driver().launchKernel;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    check(launch(f, grid.x, grid.y, grid.z, 32 * v->num_warps, 1, 1, v->shared, stream, packed.data, nullptr),
          "cuLaunchKernel", v->name);
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(iterations);
}

void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  clear_objects<Launcher>(self);
  auto* l = reinterpret_cast<Launcher*>(self);
  {
    py::gil_scoped_acquire gil;  // variants may hold Python grid functions
    delete l->variants;
  }
  delete l->name;
  Py_TYPE(self)->tp_free(self);
}

PyObject* get_count(PyObject* self, void*) {
  return PyLong_FromSize_t(reinterpret_cast<Launcher*>(self)->variants->current().size());
}

PyObject* get_name(PyObject* self, void*) {
  const std::string& name = *reinterpret_cast<Launcher*>(self)->name;
  return PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
}

PyMemberDef members[] = {
    {"fallback", T_OBJECT, offsetof(Launcher, fallback), 0, "fallback(*args): called where no variant fits"},
    {"nargs", T_PYSSIZET, offsetof(Launcher, nargs), READONLY, "runtime parameters a call takes"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef getset[] = {{"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
                        {"variant_count", get_count, nullptr, "compiled variants loaded", nullptr},
                        {"name", get_name, nullptr, "the kernel's name", nullptr},
                        {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject* launcher_type() {
  static PyTypeObject type = vectorcall_type<Launcher>(
      "opgen._C.JitLauncher",
      "A Triton kernel's launcher: launcher(*args) launches the first compiled variant that fits.",
      {dealloc, traverse_objects<Launcher>, clear_objects<Launcher>, members, getset,
       offsetof(Launcher, dict)});
  return &type;
}

py::object make_launcher(std::string name, Py_ssize_t nargs, py::object fallback) {
  TORCH_CHECK_VALUE(nargs >= 0 && nargs <= 1024, "JitLauncher: bad parameter count ", nargs);
  PyObject* self = PyType_GenericAlloc(launcher_type(), 0);
  if (self == nullptr) throw py::error_already_set();
  auto* l = reinterpret_cast<Launcher*>(self);
  l->vectorcall = call;
  l->fallback = fallback.release().ptr();
  l->variants = new Variants();
  l->nargs = nargs;
  l->name = new std::string(std::move(name));
  return py::reinterpret_steal<py::object>(self);
}

// --- Switch: a callable whose target can be replaced (the multi-kernel choice's pick) ------------------

struct Switch {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* target;
  PyObject* dict;

  // The Python objects it holds, for the cyclic GC (object_fields.h).
  template <typename F>
  void for_each_object(F&& f) {
    f(target);
    f(dict);
  }
};

// The target is held for the call: another thread may repoint the switch meanwhile (the choice's first
// call picks while others call through it), and the old target must outlive the calls it is in.
PyObject* switch_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyObject* target = Py_NewRef(reinterpret_cast<Switch*>(obj)->target);
  PyObject* result = PyObject_Vectorcall(target, args, nargsf, kwnames);
  Py_DECREF(target);
  return result;
}

void switch_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  clear_objects<Switch>(self);
  Py_TYPE(self)->tp_free(self);
}

int switch_set_target(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !PyCallable_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "Switch.target must be callable");
    return -1;
  }
  Py_XSETREF(reinterpret_cast<Switch*>(self)->target, Py_NewRef(value));
  return 0;
}

PyObject* switch_get_target(PyObject* self, void*) { return Py_NewRef(reinterpret_cast<Switch*>(self)->target); }

PyGetSetDef switch_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {"target", switch_get_target, switch_set_target, "the callable calls go to", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject* switch_type() {
  static PyTypeObject type = vectorcall_type<Switch>(
      "opgen._C.Switch",
      "Switch(target): calls go to `target`, which can be replaced.",
      {switch_dealloc, traverse_objects<Switch>, clear_objects<Switch>, nullptr, switch_getset,
       offsetof(Switch, dict)});
  return &type;
}

py::object make_switch(py::object target) {
  if (!PyCallable_Check(target.ptr())) throw py::type_error("Switch(target): target must be callable");
  PyObject* self = PyType_GenericAlloc(switch_type(), 0);
  if (self == nullptr) throw py::error_already_set();
  auto* s = reinterpret_cast<Switch*>(self);
  s->vectorcall = switch_call;
  s->target = target.release().ptr();
  return py::reinterpret_steal<py::object>(self);
}

}  // namespace

static void launch_spec(SpecKernel& kernel, std::initializer_list<Arg> args);

// This extension module (opgen._C, or a user's built by opgen_add_extension): its spec ops' launchers are
// made of its own JitLauncher type, which opgen.jit.spec.launcher is told through it. Set by add_jit.
static PyObject* own_module = nullptr;

void launch(SpecKernel& kernel, std::initializer_list<Arg> args) {
  try {
    launch_spec(kernel, args);
  } catch (py::error_already_set& e) {
    e.restore();  // the Python exception (a compile error, a missing triton) reaches the caller as it is
    throw PythonError{};
  }
}

static void launch_spec(SpecKernel& kernel, std::initializer_list<Arg> args) {
  if (kernel.launcher == nullptr) {
    py::object make = py::module_::import("opgen.jit.spec").attr("launcher");
    py::object made = make(py::str(kernel.entry_json), py::handle(own_module));
    if (!PyObject_TypeCheck(made.ptr(), launcher_type())) {
      throw py::type_error(std::string("opgen.jit.spec.launcher did not return a JitLauncher for ") + kernel.op);
    }
    if (kernel.launcher == nullptr) kernel.launcher = made.release().ptr();  // another thread may have won
  }
  auto* self = reinterpret_cast<Launcher*>(kernel.launcher);
  const Arg* data = args.begin();
  const size_t n = args.size();
  TORCH_CHECK(static_cast<Py_ssize_t>(n) == self->nargs, "opgen.jit: ", kernel.op, " passes ", n,
              " arguments to a kernel taking ", self->nargs);
  if (Variant* v = pick(self, data, n)) {
    launch_variant(*v, data, n);
    return;
  }
  std::vector<py::object> objects;
  std::vector<PyObject*> raw;
  for (const Arg& a : args) {
    PyObject* o = wrap_arg(a);
    if (o == nullptr) throw PythonError{};
    objects.push_back(py::reinterpret_steal<py::object>(o));
    raw.push_back(o);
  }
  PyObject* result = call_fallback(self, raw.data(), raw.size());
  if (result == nullptr) throw PythonError{};
  Py_DECREF(result);
}

void add_jit(py::module_& m) {
  if (PyType_Ready(launcher_type()) != 0 || PyType_Ready(switch_type()) != 0) throw py::error_already_set();
  own_module = Py_NewRef(m.ptr());  // an extension module is never unloaded
  m.def("JitLauncher", &make_launcher, py::arg("name"), py::arg("nargs"), py::arg("fallback"),
        "JitLauncher(name, nargs, fallback): a Triton kernel's launcher, with no variant yet.");
  m.def("jit_add_variant",
        [](py::object self, py::bytes binary, std::string name, unsigned num_warps, unsigned shared, py::list params,
           py::object grid, int extra_pointers, bool first, bool dependent) {
          python_errors([&] {
            add_variant(std::move(self), std::move(binary), std::move(name), num_warps, shared, std::move(params),
                        std::move(grid), extra_pointers, first, dependent);
          });
        },
        py::arg("launcher"), py::arg("binary"), py::arg("name"),
        py::arg("num_warps"), py::arg("shared"), py::arg("params"), py::arg("grid"), py::arg("extra_pointers"),
        py::arg("first") = true, py::arg("dependent") = false,
        "Adds a compiled variant to a JitLauncher (see opgen/jit/kernels.py); `dependent`: launch it with "
        "programmatic dependent launch (its source waits for the kernel before it with gdc_wait).");
  m.def("jit_launch_strict",
        [](py::object self, py::args args) { python_errors([&] { launch_strict(std::move(self), std::move(args)); }); },
        py::arg("launcher"),
        "Launches the first variant that fits, never the fallback (raises if none fits).");
  m.def("jit_bench_bare",
        [](py::object self, int64_t iterations, py::args args) {
          return python_errors([&] { return bench_bare(std::move(self), iterations, std::move(args)); });
        },
        py::arg("launcher"), py::arg("iterations"),
        "Seconds of host time per launch of a bare cuLaunchKernel loop (opgen.bench jit).");
  m.def("Switch", &make_switch, py::arg("target"), "Switch(target): calls go to `target`, which can be replaced.");
  m.def("cuda_driver_version", [] {
    return python_errors([] {
      int version = 0;
      check(driver().driverGetVersion(&version), "cuDriverGetVersion", "-");
      return version;
    });
  }, "The CUDA driver's version, as cuDriverGetVersion gives it (12080 for 12.8).");
}

}  // namespace opgen::jit
