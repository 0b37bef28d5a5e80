// The C++ executor of the wrapper IR: a prebuilt interpreter that runs a program's instructions
// over a file of c10::IValue registers, calling the generated thunks (thunk.h) for kernels. No
// compiler at compile time: a program is text, parsed once (executor_parse.cpp). No Python here
// either; module/executor_py.cpp is the Python glue.
//
// The text's grammar is docs/cpp-program.md: opgen.runtime.codegen.cpp prints it, the parser reads
// it, and `print_program` (executor_print.cpp) writes a parsed program back in it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "opgen/exec/thunk.h"

namespace opgen::exec {

struct InputSpec {
  std::string name;
  at::ScalarType dtype;
  at::Device device;
  std::vector<int64_t> sizes;  // -1 where symbolic
  std::vector<int64_t> strides;
  bool is_size = false;  // `input r0 s77 int`: an int, not a tensor (dynamic shapes)
  bool opaque = false;   // `input r1 spec opaque`: any object, never read (its register stays None)
};

// One step of a `sym` line's postfix program: push an operand (`arg`: its index in the line's
// operands) or apply an operator to the stack's top.
struct SymOp {
  enum Code : uint8_t { kPush, kAdd, kSub, kMul, kFloorDiv, kMod, kPow, kMin, kMax, kNeg };
  Code code;
  int32_t arg = 0;
};

struct Step;

// A function outside the program that its `call` lines call, bound by name when the program is
// bound: under Python, a Python callable or a Triton launcher (executor_py.cpp). The core runs no
// Python itself; a host without one (a package) refuses programs that name externs.
class Extern {
 public:
  virtual ~Extern() = default;
  // Reads the step's operands from `f` and stores its results (one per output, or unpacked).
  virtual void call(Frame& f, const Step& step) const = 0;
};

// What a literal operand of a `call` line names, where that is more than its register's int.
enum class Enum : uint8_t { kNone, kDtype, kLayout, kMemoryFormat };

// One line of setup or body, with what the non-call kinds need besides their operands.
struct Step {
  Instr instr;
  std::vector<int64_t> sizes;  // alloc and view
  std::vector<int64_t> strides;
  int64_t offset = 0;       // view; size: the dimension
  int8_t sizes_arg = -1;    // alloc and view: where sizes, strides, offset are symbolic, the
  int8_t strides_arg = -1;  // index of the operand holding them (else the fixed ones above)
  int8_t offset_arg = -1;
  std::vector<SymOp> sym;     // sym: the postfix program
  at::TensorOptions options;  // alloc
  // op: the operator, its arguments in `instr.args` by schema position
  std::optional<c10::OperatorHandle> op;
  // a kernel call's profiler range, `opgen::<node> (<target>)`, from its comment
  std::string range;
  std::string comment;  // the line's trailing comment, as written (without `  # `)
  std::string kernel;   // a kernel call: `<function>.<device>`, as written
  int32_t callee = -1;  // call: the extern's index in `Program::extern_names()`
  // call and op: the names of the operands passed by name, in the text's order (a call's are its
  // last operands; an op's operands are in schema order, after the first `positional`)
  std::vector<std::string> keywords;
  int32_t positional = 0;  // op: how many operands the text passes by position
  // call: per operand, what its literal names where a register holds only a number (a dtype, a
  // layout, a memory format): the host passes the extern the object (torch.float32), not the int
  std::vector<Enum> enums;
  // body: where the line makes a return value the host may recycle (`recycle` lines), the index of
  // its out= form in the program's recycle lines, and which return value it makes
  int32_t recycle = -1;
  int32_t result = -1;
};

// The dtypes programs and packages name (float32, bfloat16, bool, ...), by name.
const std::unordered_map<std::string_view, at::ScalarType>& dtypes_by_name();

using Registers = c10::SmallVector<c10::IValue, 32>;
using Results = c10::SmallVector<c10::IValue, 4>;

// A reference to `t`'s tensor that was never counted (no reference count change: under Python, a
// count going 1 -> 2 also increfs the tensor's PyObject, under a GIL acquire), for a caller that
// vouches `t` outlives it. It must go back through `give_back`, never through a destructor.
inline at::Tensor borrowed(const at::Tensor& t) {
  return at::Tensor(c10::intrusive_ptr<at::TensorImpl, at::UndefinedTensorImpl>::reclaim(
      t.unsafeGetTensorImpl()));
}

// Ends a borrowed reference (or any one reference of a tensor that also has a borrowed one: they
// are interchangeable) without counting it down.
inline void give_back(at::Tensor&& t) { std::move(t).unsafeReleaseTensorImpl(); }

// Whether `v` is a reference to `t`'s tensor (counted or borrowed: the same TensorImpl).
inline bool holds(const c10::IValue& v, const at::Tensor& t) {
  return v.isTensor() && v.unsafeToTensorImpl() == t.unsafeGetTensorImpl();
}

// The input registers of one call, borrowing the caller's tensors: no reference count change
// (under Python, a count going 1 -> 2 also increfs the tensor's PyObject, under a GIL acquire). The
// program never frees or overwrites an input register; the destructor gives the references back,
// uncounted, however the call ends.
class BorrowedInputs {
 public:
  explicit BorrowedInputs(Registers& regs) : regs_(regs) {}
  BorrowedInputs(const BorrowedInputs&) = delete;
  BorrowedInputs& operator=(const BorrowedInputs&) = delete;
  ~BorrowedInputs() {
    for (size_t i = 0; i < count_; ++i) {
      if (regs_[i].isTensor()) give_back(std::move(regs_[i]).toTensor());
    }
  }

  // Input `i` (set in order, from 0) is the size `v`.
  void set_size(size_t i, int64_t v) {
    regs_[i] = v;
    count_ = i + 1;
  }

  // Input `i` (set in order, from 0) is `t`, which outlives the call.
  void set(size_t i, const at::Tensor& t) {
    regs_[i] = c10::IValue(borrowed(t));
    count_ = i + 1;
  }

 private:
  Registers& regs_;
  size_t count_ = 0;
};

class Program {
 public:
  // Parses a program's text; std::invalid_argument naming the line on anything malformed or unknown
  // (an unknown kernel: "no thunk for <fn> on <backend>").
  static std::unique_ptr<Program> parse(std::string_view text);

  const std::string& name() const { return name_; }
  const std::vector<InputSpec>& inputs() const { return inputs_; }
  const std::vector<std::string>& constant_keys() const { return constant_keys_; }
  bool guarded() const { return guarded_; }
  // Whether an input has symbolic sizes (`?`): the host checks the inputs (ranges, equal sizes).
  bool dynamic() const { return dynamic_; }
  bool grad_guard() const { return grad_guard_; }
  // Whether a body kernel's binding releases the GIL (convolutions, linear layers): the caller then
  // runs the body without it, and calls that share persistent buffers one at a time (`lock`).
  bool releases_gil() const { return releases_gil_; }
  std::unique_lock<std::mutex> lock() const {
    return persistent_ ? std::unique_lock<std::mutex>(*mutex_) : std::unique_lock<std::mutex>();
  }
  const std::string& return_form() const { return return_form_; }

  // The externs the program calls, by the names of its `extern` lines, in order.
  const std::vector<std::string>& extern_names() const { return extern_names_; }

  // The setup values the host may bind itself (`shared` lines): (static, name), in order.
  const std::vector<std::pair<int32_t, std::string>>& shared() const { return shared_; }

  // A copy of this bound program (sharing its statics, externs and lock) whose body has, in place
  // of each call of an extern in `picks`, the lines of that extern's alternative of the picked
  // name: the host settles a choice (a fused kernel: its Triton launch or its ATen calls) on a
  // first call. ValueError (c10) on a pick with no such alternative.
  std::unique_ptr<Program> resolved(
      const std::unordered_map<std::string, std::string>& picks) const;

  // Binds the constants (one per `constant` line, in order) and the externs (one per name of
  // `extern_names()`), and runs the setup lines; then drops the statics only setup read, unless
  // `keep_setup_values` (for `named_statics`). `given`: values for statics of `shared()` that the
  // host computed already (the Python function's packed and folded weights): a setup line whose
  // results are all given is not run. Persistent buffers, what setup writes in place, and whatever
  // setup derives from them are never taken: they stay the program's own.
  void bind(const std::vector<at::Tensor>& constants,
            std::vector<std::shared_ptr<const Extern>> externs = {}, bool keep_setup_values = false,
            const std::vector<std::pair<int32_t, c10::IValue>>& given = {});

  // The statics the program's text names (s0...), after bind: constants, then setup's values.
  c10::ArrayRef<c10::IValue> named_statics() const {
    return c10::ArrayRef<c10::IValue>(statics_.data(), static_cast<size_t>(num_named_statics_));
  }

  // Registers for one call, with the inputs to fill in at 0..inputs().size()-1.
  Registers registers() const { return Registers(num_registers_); }

  // Runs the body; the values of its return line go to `results`. Kernel errors keep their type and
  // gain the instruction's text. While a profiler (a RecordFunction callback) is on, the call runs
  // in a range named after the graph and each kernel call in one named after its node, as the
  // Python backend's profiled twin does (`opgen::add (aten.add.Tensor)`). `recycled`: by return
  // value, a tensor to write that value into where it is `recyclable` (undefined: make a new one);
  // the host vouches that nothing else reaches it, that it outlives the call and that it has the
  // value's dtype, sizes and strides. The value's register borrows it (`borrowed`: no reference
  // count change), so a value written into `recycled[k]` comes back as a borrowed `results[k]`
  // that the host ends with `give_back` (see `wrote_into`); if the run throws, it gives back
  // what its registers borrowed itself.
  void run(Registers& regs, Results& results, c10::ArrayRef<at::Tensor> recycled = {}) const;

  // Whether `result` is return value k written into `recycled[k]` (a borrowed reference).
  static bool wrote_into(const c10::IValue& result, c10::ArrayRef<at::Tensor> recycled, size_t k) {
    return k < recycled.size() && recycled[k].defined() && holds(result, recycled[k]);
  }

  // The return values that `run` can write into tensors the host gives (`recycle` lines).
  const std::vector<int32_t>& recyclable() const { return recyclable_; }

 private:
  void run_steps(const std::vector<Step>& steps, c10::IValue* regs, Results* results,
                 bool ranged = false, c10::ArrayRef<at::Tensor> recycled = {}) const;
  // Runs one line; true after the return line.
  bool run_step(Frame& f, const Step& s, Results* results,
                c10::ArrayRef<at::Tensor> recycled) const;
  // The setup lines left to run once `given` (see `bind`) is in the statics.
  std::vector<Step> setup_not_given(const std::vector<std::pair<int32_t, c10::IValue>>& given);
  c10::IValue returned(Frame& f, const Instr& in, size_t k) const;
  void call_operator(Frame& f, const Step& s) const;
  // After a throw: ends the borrowed references to `recycled` that registers or results still hold.
  static void give_back_borrowed(Registers& regs, Results& results,
                                 c10::ArrayRef<at::Tensor> recycled);

  std::string name_;
  std::string range_;  // the graph's profiler range: `opgen::<name> (<the generated header>)`
  std::vector<InputSpec> inputs_;
  std::vector<std::string> constant_keys_;
  std::vector<Step> setup_;
  std::vector<Step> body_;
  std::vector<Step> recycles_;       // the out= forms of `recycle` lines (Step::recycle)
  std::vector<int32_t> recyclable_;  // the return values they make
  std::vector<c10::IValue> statics_;
  std::vector<std::string> extern_names_;
  std::vector<std::pair<int32_t, std::string>> shared_;
  std::vector<std::shared_ptr<const Extern>> externs_;
  // extern name -> pick -> its lines for each call of the extern, in the body's order
  std::unordered_map<std::string, std::unordered_map<std::string, std::vector<std::vector<Step>>>>
      alternatives_;
  int32_t num_registers_ = 0;
  int32_t num_named_statics_ = 0;
  bool guarded_ = false;
  bool dynamic_ = false;
  bool grad_guard_ = false;
  bool releases_gil_ = false;
  bool persistent_ = false;  // setup allocates buffers the body writes
  std::shared_ptr<std::mutex> mutex_ =
      std::make_shared<std::mutex>();  // shared with `resolved` copies
  bool bound_ = false;
  std::string return_form_ = "tuple";

  // What the text says that running it does not need, for `print_program` only.
  struct Text {
    std::string header;  // of the `# @generated by opgen: <header>. Do not edit.` line
    // The guard lines: before which body step, the inputs they name, whether `grad`.
    struct Guard {
      size_t at = 0;
      std::vector<int32_t> inputs;
      bool grad = false;
    };
    std::vector<Guard> guards;
    // By static: what its literal names where the value is a number only (torch.float32: kDtype).
    std::vector<Enum> literal_enums;
    // The `alternative <extern> <pick>` sections, in the text's order.
    std::vector<std::pair<std::string, std::string>> alternatives;
  };
  Text text_;

  friend class Parser;
  friend class Printer;
};

// `program` as text in the grammar the parser reads (docs/cpp-program.md), canonical: the parser's
// input printed by opgen.runtime.codegen.cpp comes back byte for byte, less its whole-line comments
// (other than the header line). For tests and debugging; nothing runs it on a call's path.
std::string print_program(const Program& program);

}  // namespace opgen::exec
