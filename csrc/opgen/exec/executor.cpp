// The executor's interpreter: binds a parsed program's constants, runs its setup once and its body
// per call (executor.h).
#include "opgen/exec/executor.h"

#include <ATen/ops/as_strided.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/empty_strided_cpu_dispatch.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "opgen/kernels/int_ops.h"

namespace opgen::exec {

void Program::bind(const std::vector<at::Tensor>& constants,
                   std::vector<std::shared_ptr<const Extern>> externs, bool keep_setup_values,
                   const std::vector<std::pair<int32_t, c10::IValue>>& given) {
  TORCH_CHECK(!bound_, "opgen executor program ", name_, " is already bound");
  TORCH_CHECK(constants.size() == constant_keys_.size(), "opgen executor program ", name_,
              " binds ", constant_keys_.size(), " constants, got ", constants.size());
  TORCH_CHECK(externs.size() == extern_names_.size(), "opgen executor program ", name_, " calls ",
              extern_names_.size(), " externs, got ", externs.size());
  for (size_t i = 0; i < externs.size(); ++i) {
    TORCH_CHECK(externs[i] != nullptr, "opgen executor program ", name_,
                ": no function for extern ", extern_names_[i]);
  }
  externs_ = std::move(externs);
  for (size_t i = 0; i < constants.size(); ++i) statics_[i] = constants[i];
  if (given.empty()) {
    run_steps(setup_, statics_.data(), nullptr);
  } else {
    run_steps(setup_not_given(given), statics_.data(), nullptr);
  }
  bound_ = true;
  if (keep_setup_values) return;
  // What only setup read (weights before folding or packing) is dropped: the body never sees it.
  std::vector<bool> read(statics_.size(), false);
  for (const Step& s : body_) {
    for (const Operand& o : s.instr.args) {
      if (o.where == Where::kStatic) read[o.index] = true;
    }
  }
  for (int32_t k = 0; k < num_named_statics_; ++k) {
    if (!read[k]) statics_[k] = c10::IValue();
  }
}

std::vector<Step> Program::setup_not_given(
    const std::vector<std::pair<int32_t, c10::IValue>>& given) {
  const auto makes = [](const Step& s) {
    return std::any_of(s.instr.outs.begin(), s.instr.outs.end(), [](int32_t o) { return o >= 0; });
  };
  // What stays the program's own: persistent buffers (allocs), what a setup line writes without
  // making anything (`_ = ...`: the given value had that write already), and what setup derives
  // from either (a view of a buffer must view the program's buffer).
  std::vector<bool> own(statics_.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    const auto mark = [&](int32_t k) {
      if (k >= 0 && !own[k]) own[k] = changed = true;
    };
    for (const Step& s : setup_) {
      bool derived = s.instr.kind == Instr::Kind::kAlloc;
      for (const Operand& o : s.instr.args) {
        if (o.where != Where::kStatic) continue;
        if (!makes(s)) mark(o.index);
        derived |= own[o.index];
      }
      if (derived) {
        for (int32_t out : s.instr.outs) mark(out);
      }
    }
  }
  std::vector<bool> taken(statics_.size(), false);
  for (const auto& [k, value] : given) {
    TORCH_CHECK(k >= 0 && static_cast<size_t>(k) < statics_.size(), "opgen executor program ",
                name_, ": no static s", k, " to give");
    if (own[k]) continue;
    statics_[k] = value;
    taken[k] = true;
  }
  // A line runs unless it makes something and everything it makes was given.
  std::vector<Step> todo;
  for (const Step& s : setup_) {
    const auto& outs = s.instr.outs;
    const bool given_all =
        std::all_of(outs.begin(), outs.end(), [&](int32_t o) { return o < 0 || taken[o]; });
    if (!(makes(s) && given_all)) todo.push_back(s);
  }
  return todo;
}

std::unique_ptr<Program> Program::resolved(
    const std::unordered_map<std::string, std::string>& picks) const {
  TORCH_CHECK(bound_, "opgen executor program ", name_, " is resolved before it is bound");
  auto out = std::make_unique<Program>(*this);
  out->body_.clear();
  std::unordered_map<std::string, size_t> calls;  // extern -> calls seen so far
  for (const Step& s : body_) {
    const auto pick =
        s.instr.kind == Instr::Kind::kExtern ? picks.find(extern_names_[s.callee]) : picks.end();
    if (pick == picks.end()) {
      out->body_.push_back(s);
      continue;
    }
    const size_t site = calls[pick->first]++;
    const auto choice = alternatives_.find(pick->first);
    const auto* sites = choice == alternatives_.end() || choice->second.count(pick->second) == 0
                            ? nullptr
                            : &choice->second.at(pick->second);
    TORCH_CHECK_VALUE(sites != nullptr, "opgen executor program ", name_, ": ", pick->first,
                      " has no alternative ", pick->second);
    TORCH_CHECK_VALUE(site < sites->size(), "opgen executor program ", name_, ": call ", site + 1,
                      " of ", pick->first, " has no alternative ", pick->second);
    const std::vector<Step>& chosen = (*sites)[site];
    out->body_.insert(out->body_.end(), chosen.begin(), chosen.end());
  }
  return out;
}

void Program::run(Registers& regs, Results& results, c10::ArrayRef<at::Tensor> recycled) const {
  TORCH_CHECK(bound_, "opgen executor program ", name_, " runs before it is bound");
  // The dispatcher's own test for a profiler: a thread-local read (at::hasCallbacks() takes the
  // global callback manager's lock, on every call).
  auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  try {
    if (C10_LIKELY(!callbacks.has_value())) {
      run_steps(body_, regs.data(), &results, /*ranged=*/false, recycled);
      return;
    }
    at::RecordFunction graph(std::move(*callbacks));
    if (graph.isActive()) graph.before(std::string_view(range_));
    run_steps(body_, regs.data(), &results, /*ranged=*/true, recycled);
  } catch (...) {
    give_back_borrowed(regs, results, recycled);
    throw;
  }
}

void Program::give_back_borrowed(Registers& regs, Results& results,
                                 c10::ArrayRef<at::Tensor> recycled) {
  for (const at::Tensor& t : recycled) {
    if (!t.defined()) continue;
    const auto of_t = [&t](const c10::IValue& v) { return holds(v, t); };
    c10::IValue* holder = std::find_if(regs.begin(), regs.end(), of_t);
    if (holder == regs.end()) holder = std::find_if(results.begin(), results.end(), of_t);
    if (holder == results.end()) continue;  // its recycle line had not run
    give_back(std::move(*holder).toTensor());
  }
}

namespace {

// A list the `list` instruction built (a generic list) as the typed list a boxed kernel expects.
c10::IValue typed(const c10::IValue& v, const c10::Argument& argument) {
  if (!v.isList() || argument.type()->kind() != c10::TypeKind::ListType) return v;
  const auto element = argument.type()->containedType(0);
  const auto items = v.toListRef();
  if (element->kind() == c10::TypeKind::TensorType) {
    c10::List<at::Tensor> out;
    for (const auto& item : items) out.push_back(item.toTensor());
    return out;
  }
  if (element->kind() == c10::TypeKind::OptionalType) {
    c10::List<std::optional<at::Tensor>> out;
    for (const auto& item : items)
      out.push_back(item.isNone() ? std::nullopt : std::optional(item.toTensor()));
    return out;
  }
  return v;
}

// A line's sizes or strides: the fixed ones, or the list in operand `arg` (a symbolic shape).
c10::IntArrayRef ints_of(const Frame& f, const Instr& in, int8_t arg,
                         const std::vector<int64_t>& fixed, c10::SmallVector<int64_t, 6>& storage) {
  if (arg < 0) return fixed;
  storage.clear();
  for (const c10::IValue& v : f.at(in.args[arg]).toListRef()) storage.push_back(v.toInt());
  return storage;
}

int64_t evaluate(const Frame& f, const Step& s) {
  int64_t stack[32];
  int top = 0;
  for (const SymOp& op : s.sym) {
    if (op.code == SymOp::kPush) {
      const c10::IValue& v = f.at(s.instr.args[op.arg]);
      stack[top++] = v.isBool() ? static_cast<int64_t>(v.toBool()) : v.toInt();
      continue;
    }
    if (op.code == SymOp::kNeg) {
      stack[top - 1] = -stack[top - 1];
      continue;
    }
    const int64_t b = stack[--top];
    int64_t& a = stack[top - 1];
    switch (op.code) {
      case SymOp::kAdd:
        a += b;
        break;
      case SymOp::kSub:
        a -= b;
        break;
      case SymOp::kMul:
        a *= b;
        break;
      case SymOp::kFloorDiv:
        a = floordiv(a, b);
        break;
      case SymOp::kMod:
        a = floormod(a, b);
        break;
      case SymOp::kPow: {
        TORCH_CHECK_VALUE(b >= 0, "a negative power in a size expression");
        int64_t r = 1;
        for (int64_t k = 0; k < b; ++k) r *= a;
        a = r;
        break;
      }
      case SymOp::kMin:
        a = std::min(a, b);
        break;
      case SymOp::kMax:
        a = std::max(a, b);
        break;
      default:
        break;
    }
  }
  return stack[0];
}

}  // namespace

void Program::call_operator(Frame& f, const Step& s) const {
  const Instr& in = s.instr;
  const auto& arguments = s.op->schema().arguments();
  torch::jit::Stack stack;
  stack.reserve(in.args.size());
  for (size_t k = 0; k < in.args.size(); ++k)
    stack.push_back(typed(f.at(in.args[k]), arguments[k]));
  s.op->callBoxed(stack);
  if (in.unpack && stack.size() == 1 && stack[0].isList()) {  // a list result, unpacked
    const auto items = stack[0].toListRef();
    for (size_t k = 0; k < items.size() && k < in.outs.size(); ++k)
      detail::store(f, in.outs[k], items[k]);
    return;
  }
  for (size_t k = 0; k < stack.size() && k < in.outs.size(); ++k)
    detail::store(f, in.outs[k], std::move(stack[k]));
}

// A returned value: moved out of its register where nothing else returns it (so that the caller
// holds the only reference and wraps it without a reference count change), else copied.
c10::IValue Program::returned(Frame& f, const Instr& in, size_t k) const {
  const Operand& o = in.args[k];
  if (o.where != Where::kRegister || o.index < static_cast<int32_t>(inputs_.size())) return f.at(o);
  for (size_t j = k + 1; j < in.args.size(); ++j) {
    if (in.args[j].where == o.where && in.args[j].index == o.index) return f.at(o);
  }
  return std::move(f.regs[o.index]);
}

void Program::run_steps(const std::vector<Step>& steps, c10::IValue* regs, Results* results,
                        bool ranged, c10::ArrayRef<at::Tensor> recycled) const {
  Frame f{regs, statics_.data()};
  for (const Step& s : steps) {
    if (C10_UNLIKELY(ranged) && !s.range.empty()) {  // a profiler is on: the step in its range
      at::RecordFunction range(at::RecordScope::USER_SCOPE);
      if (range.isActive()) range.before(std::string_view(s.range));
      if (run_step(f, s, results, recycled)) return;
    } else if (run_step(f, s, results, recycled)) {
      return;
    }
  }
}

bool Program::run_step(Frame& f, const Step& s, Results* results,
                       c10::ArrayRef<at::Tensor> recycled) const {
  const Instr& in = s.instr;
  if (s.recycle >= 0 && static_cast<size_t>(s.result) < recycled.size() &&
      recycled[s.result].defined()) {  // the value goes into the tensor the host gave
    f.regs[in.outs[0]] = borrowed(recycled[s.result]);
    return run_step(f, recycles_[s.recycle], results, {});
  }
  try {
    switch (in.kind) {
      case Instr::Kind::kCall:
        in.thunk(f, in);
        break;
      case Instr::Kind::kOp:
        call_operator(f, s);
        break;
      case Instr::Kind::kExtern:
        externs_[s.callee]->call(f, s);
        break;
      case Instr::Kind::kAlloc: {
        c10::SmallVector<int64_t, 6> sizes_storage, strides_storage;
        const auto sizes = ints_of(f, in, s.sizes_arg, s.sizes, sizes_storage);
        const auto strides = ints_of(f, in, s.strides_arg, s.strides, strides_storage);
        f.regs[in.outs[0]] = s.options.device().is_cpu()
                                 ? at::cpu::empty_strided(sizes, strides, s.options)
                                 : at::empty_strided(sizes, strides, s.options);
        break;
      }
      case Instr::Kind::kView: {
        c10::SmallVector<int64_t, 6> sizes_storage, strides_storage;
        const auto sizes = ints_of(f, in, s.sizes_arg, s.sizes, sizes_storage);
        const auto strides = ints_of(f, in, s.strides_arg, s.strides, strides_storage);
        const int64_t offset = s.offset_arg < 0 ? s.offset : f.at(in.args[s.offset_arg]).toInt();
        const at::Tensor& source = f.at(in.args[0]).toTensor();
        f.regs[in.outs[0]] = source.is_cpu() ? at::cpu::as_strided(source, sizes, strides, offset)
                                             : at::as_strided(source, sizes, strides, offset);
        break;
      }
      case Instr::Kind::kSize:
        f.regs[in.outs[0]] = f.at(in.args[0]).toTensor().size(s.offset);
        break;
      case Instr::Kind::kSym:
        f.regs[in.outs[0]] = evaluate(f, s);
        break;
      case Instr::Kind::kList: {
        c10::impl::GenericList list(c10::AnyType::get());
        list.reserve(in.args.size());
        for (const Operand& o : in.args) list.push_back(f.at(o));
        f.regs[in.outs[0]] = c10::IValue(std::move(list));
        break;
      }
      case Instr::Kind::kFree:  // never an input's register (the caller's borrowed tensors)
        for (const Operand& o : in.args) {
          if (o.index >= static_cast<int32_t>(inputs_.size())) f.regs[o.index] = c10::IValue();
        }
        break;
      case Instr::Kind::kReturn:
        if (results != nullptr) {
          for (size_t k = 0; k < in.args.size(); ++k) results->push_back(returned(f, in, k));
        }
        return true;
      case Instr::Kind::kGuard:
        break;
    }
  } catch (c10::Error& e) {
    e.add_context("in opgen program " + name_ + ": " + in.text);
    throw;
  }
  return false;
}

}  // namespace opgen::exec
