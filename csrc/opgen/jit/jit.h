// JIT (Triton) kernels: what generated kernel_ops bindings of Triton ops call, and the
// JitLauncher / Switch Python types (opgen._C). See opgen/jit/ for the Python side.
//
// A launcher holds one or more *variants* of one Triton kernel: a compiled binary (loaded once per
// device, its CUfunction kept), its launch metadata, and the specialization it was compiled for
// (the dtype of every pointer, 16-byte alignment, divisibility by 16 of integers, integers equal
// to 1 and None baked in as constants). A call packs the arguments, takes the first variant whose
// specialization holds for them, computes the grid from the variant's grid program and launches
// on the current stream of the tensors' device. When no variant fits, the call goes to the
// launcher's Python `fallback` (compile a new specialization, autotune, launch). CPU builds
// compile jit_stub.cpp instead: the types exist, and using them raises a clear RuntimeError.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>

namespace opgen::jit {

// One kernel argument as generated code passes it (the Triton function's runtime parameters, in
// order; constexpr parameters are fixed per variant and never passed).
// Trivially constructible: the launcher keeps arrays of them on the stack, uninitialised.
struct Arg {
  enum class Kind : uint8_t { Tensor, Int, Float, Bool, None };
  Kind kind;
  const at::Tensor* tensor;  // borrowed for the duration of the call
  int64_t i;
  double f;
};
inline Arg tensor_arg(const at::Tensor& t) { return {Arg::Kind::Tensor, &t, 0, 0.0}; }
inline Arg int_arg(int64_t v) { return {Arg::Kind::Int, nullptr, v, 0.0}; }
inline Arg float_arg(double v) { return {Arg::Kind::Float, nullptr, 0, v}; }
inline Arg bool_arg(bool v) { return {Arg::Kind::Bool, nullptr, v ? 1 : 0, 0.0}; }
inline Arg none_arg() { return {Arg::Kind::None, nullptr, 0, 0.0}; }

// The Triton kernel of one spec op. `entry_json` is the op's registry entry (with its "triton"
// section); the first call hands it to Python (`opgen.jit.spec.launcher(entry_json)`), which
// returns the op's launcher and starts compiling in the background.
struct SpecKernel {
  const char* op;
  const char* entry_json;
  PyObject* launcher = nullptr;  // owned; made on the first call (under the GIL), never freed
};

// Launches `kernel` with `args`. Throws c10::Error (or PythonError with a Python exception set)
// on bad arguments, when the build has no CUDA, or when Triton is missing.
void launch(SpecKernel& kernel, std::initializer_list<Arg> args);

// Whether `o` is a JitLauncher (never, in CPU builds).
bool is_launcher(PyObject* o);

// Launches the JitLauncher `launcher` with `args` (its runtime parameters, in order) from C++: the
// first variant that fits, else its Python fallback (compile, autotune, launch). Takes the GIL only
// where Python runs (the fallback, a Python grid). Throws c10::Error, or PythonError with a Python
// exception set.
void launch_with(PyObject* launcher, const Arg* args, size_t n);

// Adds JitLauncher, Switch and the driver/bench helpers to `m`.
void add_jit(pybind11::module_& m);

}  // namespace opgen::jit
