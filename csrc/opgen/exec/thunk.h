// What a generated thunk sees (opgen/gen/thunks.py): one instruction of the executor's program and
// the registers it reads and writes. A thunk unboxes its arguments from c10::IValue registers into
// the same C++ locals a binding declares, calls the same kernel (at::cpu::add, a composite or an
// opgen kernel), and stores the results. No Python here: the executor's core runs without an
// interpreter.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opgen/kernels/kernel_args.h"

namespace opgen {

namespace exec {

// Where an operand lives: a register of the call's frame, a static of the program (constants,
// literals, values made once at bind time), or nowhere (the schema default applies).
enum class Where : uint8_t { kMissing, kRegister, kStatic };

struct Operand {
  Where where = Where::kMissing;
  int32_t index = 0;
};

struct Frame;
struct Instr;
using Thunk = void (*)(Frame&, const Instr&);

struct Instr {
  enum class Kind : uint8_t {
    kCall,
    kOp,
    kExtern,
    kAlloc,
    kView,
    kList,
    kSize,
    kSym,
    kFree,
    kReturn,
    kGuard
  };
  Kind kind = Kind::kCall;
  Thunk thunk = nullptr;
  std::vector<Operand> args;  // calls: one per schema argument; others: what the kind reads
  std::vector<int32_t> outs;  // registers written (-1: a result nobody reads)
  bool unpack = false;        // the results of a tuple or list return go to `outs` one by one
  std::string text;           // the instruction as printed (for error messages)
};

struct Frame {
  c10::IValue* regs;
  const c10::IValue* statics;

  const c10::IValue& at(const Operand& o) const {
    return o.where == Where::kRegister ? regs[o.index] : statics[o.index];
  }
  // Trailing arguments left at their defaults are not printed: `args` may be shorter than the
  // schema.
  bool has(const Instr& in, size_t i) const {
    return i < in.args.size() && in.args[i].where != Where::kMissing;
  }
  const c10::IValue& at(const Instr& in, size_t i) const { return at(in.args[i]); }

  const at::Tensor& tensor(const Instr& in, size_t i) const { return at(in, i).toTensor(); }
  // Kernels take written tensors as `at::Tensor&`: the handle, not the register, is what they
  // change.
  at::Tensor& mutable_tensor(const Instr& in, size_t i) const {
    return const_cast<at::Tensor&>(tensor(in, i));
  }

  template <typename T>
  T arg(const Instr& in, size_t i) const;

  template <typename R>
  void result(const Instr& in, R&& value);
};

namespace detail {

template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

template <typename T>
struct is_array : std::false_type {};
template <size_t N>
struct is_array<std::array<bool, N>> : std::true_type {};

template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {};

template <typename T>
struct is_tuple : std::false_type {};
template <typename... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

template <typename T>
T unbox(const c10::IValue& v);

template <typename T>
T unbox_scalar(const c10::IValue& v) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return v.toTensor();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return v.isBool() ? static_cast<int64_t>(v.toBool()) : v.toInt();  // Python's bool is an int
  } else if constexpr (std::is_same_v<T, double>) {
    return v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble();  // as Python passes 1 for 1.0
  } else if constexpr (std::is_same_v<T, bool>) {
    return v.toBool();
  } else if constexpr (std::is_same_v<T, at::Scalar>) {
    return v.toScalar();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.toStringRef();
  } else if constexpr (std::is_same_v<T, at::ScalarType>) {
    return v.toScalarType();
  } else if constexpr (std::is_same_v<T, at::Layout>) {
    return v.toLayout();
  } else if constexpr (std::is_same_v<T, at::Device>) {
    return v.toDevice();
  } else if constexpr (std::is_same_v<T, at::MemoryFormat>) {
    return v.toMemoryFormat();
  } else {
    static_assert(sizeof(T) == 0, "no unboxing for this argument type");
  }
}

template <typename T>
T unbox(const c10::IValue& v) {
  if constexpr (is_optional<T>::value) {
    if (v.isNone()) return std::nullopt;
    return unbox<typename T::value_type>(v);
  } else if constexpr (is_vector<T>::value) {
    T out;
    const auto items = v.toListRef();
    out.reserve(items.size());
    for (const c10::IValue& item : items) out.push_back(unbox<typename T::value_type>(item));
    return out;
  } else if constexpr (is_array<T>::value) {
    T out{};
    const auto items = v.toListRef();
    TORCH_CHECK(items.size() == out.size(), "expected a list of ", out.size(), " bools, got ",
                items.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = items[i].toBool();
    return out;
  } else if constexpr (std::is_same_v<T, c10::List<std::optional<at::Tensor>>>) {
    T out;
    for (const c10::IValue& item : v.toListRef())
      out.push_back(unbox<std::optional<at::Tensor>>(item));
    return out;
  } else {
    return unbox_scalar<T>(v);
  }
}

inline void store(Frame& f, int32_t out, c10::IValue value) {
  if (out >= 0) f.regs[out] = std::move(value);
}

template <typename R>
c10::IValue box(R&& value) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return c10::IValue(std::forward<R>(value));
  } else if constexpr (is_vector<T>::value) {
    return c10::IValue(c10::List<typename T::value_type>(std::forward<R>(value)));
  } else {
    return c10::IValue(std::forward<R>(value));
  }
}

}  // namespace detail

template <typename T>
T Frame::arg(const Instr& in, size_t i) const {
  return detail::unbox<T>(at(in, i));
}

// A kernel's result into the instruction's output registers: one value, a tuple's elements, or
// (with `unpack`) a list's elements. What goes to `_` is never boxed (a boxed copy of an out=
// kernel's `out` would count its tensor up and down: under Python, a GIL acquire each way).
template <typename R>
void Frame::result(const Instr& in, R&& value) {
  using T = std::decay_t<R>;
  if constexpr (detail::is_tuple<T>::value) {
    std::apply(
        [&](auto&... items) {
          size_t k = 0;
          (((k < in.outs.size() && in.outs[k] >= 0
                 ? detail::store(*this, in.outs[k], detail::box(items))
                 : void()),
            ++k),
           ...);
        },
        value);
  } else if constexpr (detail::is_vector<T>::value) {
    if (in.unpack) {
      for (size_t k = 0; k < value.size() && k < in.outs.size(); ++k)
        detail::store(*this, in.outs[k], value[k]);
    } else if (!in.outs.empty() && in.outs[0] >= 0) {
      detail::store(*this, in.outs[0], detail::box(std::forward<R>(value)));
    }
  } else if (!in.outs.empty() && in.outs[0] >= 0) {
    detail::store(*this, in.outs[0], detail::box(std::forward<R>(value)));
  }
}

// One entry of a generated thunk table: a kernel_ops function on one backend ("cpu", "cuda",
// "default").
struct ThunkEntry {
  const char* name;
  const char* backend;
  Thunk thunk;
  bool release_gil;  // the binding releases the GIL around this kernel (`release_gil:` in the spec)
};

// A module's thunks as another module's executor sees them: what every extension's `THUNKS`
// capsule ("opgen.thunks") points to, and what thunk_registry.h's register_thunks takes. The
// executor calls a thunk of another module with its own Frame and Instr, so two modules may share
// thunks only where this header (the layout of everything a thunk touches) and torch are the same:
// `abi` says which (OPGEN_THUNK_ABI, opgen/cmake/opgen.cmake).
struct ThunkExport {
  const char* abi;                  // "thunk.h:<sha-256 prefix of this file>,torch:<version>"
  const ThunkEntry* const* tables;  // the module's generated tables, null-terminated (kThunkTables)
  const char* digest;               // the identity of its thunks (kThunkDigest)
};

}  // namespace exec
}  // namespace opgen
