// The executor's printer: a parsed Program -> its text, in the grammar of docs/cpp-program.md (the
// one executor_parse.cpp reads and opgen.runtime.codegen.cpp prints). It prints what the parse
// kept, never the lines it read: a round trip (tests/runtime/test_cpp_program_roundtrip.py) shows
// that the parser keeps everything the text says and reads each form as the printer meant it.
#include <c10/util/Exception.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "opgen/exec/executor.h"

namespace opgen::exec {

namespace {

// A key, name or string as the printer escapes it: `[A-Za-z0-9_.:-]` as they are, any other byte as
// %XX (codegen/cpp_literals.py's `escape`).
std::string escaped(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    const bool safe = (byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
                      (byte >= '0' && byte <= '9') || c == '_' || c == '.' || c == ':' || c == '-';
    if (safe) {
      out.push_back(c);
    } else {
      out += {'%', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  return out;
}

// A double as Python's repr writes it: the shortest digits that read back to it, positional where
// the exponent lies in [-4, 16), else `<d>[.<digits>]e<sign><2+ digits>`; inf, -inf, nan.
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto [end, ec] =
      std::to_chars(buffer, buffer + sizeof(buffer), v, std::chars_format::scientific);
  TORCH_INTERNAL_ASSERT(ec == std::errc());
  const std::string_view text(buffer, end - buffer);  // -d.ddde+XX
  const size_t e = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (const char c : text.substr(negative ? 1 : 0, e - (negative ? 1 : 0))) {
    if (c != '.') digits.push_back(c);
  }
  const int exponent = std::atoi(std::string(text.substr(e + 1)).c_str());
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else {
      const size_t point = static_cast<size_t>(exponent) + 1;
      if (digits.size() < point) digits.append(point - digits.size(), '0');
      const std::string fraction = digits.substr(point);
      out += digits.substr(0, point) + "." + (fraction.empty() ? "0" : fraction);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  const std::string magnitude = std::to_string(std::abs(exponent));
  return out + (exponent < 0 ? "e-" : "e+") + (magnitude.size() < 2 ? "0" : "") + magnitude;
}

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [name, type] : dtypes_by_name()) {
    if (type == dtype) return std::string(name);
  }
  TORCH_CHECK(false, "opgen executor program: no name for dtype ", dtype);
}

std::string memory_format_name(at::MemoryFormat m) {
  switch (m) {
    case at::MemoryFormat::Contiguous:
      return "contiguous_format";
    case at::MemoryFormat::Preserve:
      return "preserve_format";
    case at::MemoryFormat::ChannelsLast:
      return "channels_last";
    case at::MemoryFormat::ChannelsLast3d:
      return "channels_last_3d";
    default:
      TORCH_CHECK(false, "opgen executor program: no name for memory format ", m);
  }
}

// `[4,16]`; -1 as `?` where `symbolic` (an input's sizes and strides).
std::string ints(const std::vector<int64_t>& values, bool symbolic = false) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ",";
    out += symbolic && values[i] == -1 ? "?" : std::to_string(values[i]);
  }
  return out + "]";
}

// A literal operand: `kind` says what a number names (a dtype, a layout, a memory format).
std::string literal(const c10::IValue& v, Enum kind = Enum::kNone) {
  switch (kind) {
    case Enum::kDtype:
      return "torch." + dtype_name(static_cast<at::ScalarType>(v.toInt()));
    case Enum::kLayout:
      return "layout(strided)";
    case Enum::kMemoryFormat:
      return "memory_format(" + memory_format_name(static_cast<at::MemoryFormat>(v.toInt())) + ")";
    case Enum::kNone:
      break;
  }
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) return python_float(v.toDouble());
  if (v.isString()) return "'" + escaped(v.toStringRef()) + "'";
  if (v.isDevice()) return "device(" + v.toDevice().str() + ")";
  TORCH_CHECK(v.isList(), "opgen executor program: no literal form for a ", v.tagKind());
  std::string out = "[";
  for (const c10::IValue& item : v.toListRef()) {
    if (out.size() > 1) out += ",";
    out += literal(item);
  }
  return out + "]";
}

}  // namespace

// Prints each section's lines from the steps the parser made, as the grammar writes them.
class Printer {
 public:
  explicit Printer(const Program& p) : p_(p) {}

  std::string print() {
    const std::string& header = p_.text_.header;
    line("# @generated by opgen" + (header.empty() ? "" : ": " + header) + ". Do not edit.");
    line("program " + p_.name_ + " registers " + std::to_string(p_.num_registers_) + " statics " +
         std::to_string(p_.num_named_statics_));
    for (size_t i = 0; i < p_.inputs_.size(); ++i) line(input(i));
    for (size_t k = 0; k < p_.constant_keys_.size(); ++k)
      line("constant s" + std::to_string(k) + " " + escaped(p_.constant_keys_[k]));
    for (const std::string& name : p_.extern_names_) line("extern " + name);
    for (const auto& [k, name] : p_.shared_) line("shared s" + std::to_string(k) + " " + name);
    line("setup:");
    for (const Step& s : p_.setup_) line("  " + step(s, 's'));
    line("body:");
    body();
    std::unordered_map<std::string, size_t> sections;  // (extern, pick) -> sections printed
    for (const auto& [name, pick] : p_.text_.alternatives) {
      line("alternative " + name + " " + pick);
      const size_t site = sections[name + " " + pick]++;
      for (const Step& s : p_.alternatives_.at(name).at(pick).at(site)) line("  " + step(s, 'r'));
    }
    return std::move(out_);
  }

 private:
  void line(const std::string& text) { out_ += text + "\n"; }

  void body() {
    const auto& guards = p_.text_.guards;
    size_t g = 0;
    for (size_t i = 0; i <= p_.body_.size(); ++i) {
      for (; g < guards.size() && guards[g].at == i; ++g) line("  " + guard(guards[g]));
      if (i == p_.body_.size()) break;
      const Step& s = p_.body_[i];
      line("  " + step(s, 'r'));
      if (s.recycle >= 0)
        line("  recycle " + std::to_string(s.result) + " " + step(p_.recycles_[s.recycle], 'r'));
    }
  }

  static std::string guard(const Program::Text::Guard& g) {
    std::string out = "guard";
    for (const int32_t r : g.inputs) out += " r" + std::to_string(r);
    return out + (g.grad ? " grad" : "");
  }

  std::string input(size_t i) const {
    const InputSpec& in = p_.inputs_[i];
    const std::string head = "input r" + std::to_string(i) + " " + escaped(in.name) + " ";
    if (in.is_size) return head + "int";
    if (in.opaque) return head + "opaque";
    return head + dtype_name(in.dtype) + " " + in.device.str() + " " + ints(in.sizes, true) + " " +
           ints(in.strides, true);
  }

  std::string operand(const Operand& o) const {
    switch (o.where) {
      case Where::kMissing:
        return "_";
      case Where::kRegister:
        return "r" + std::to_string(o.index);
      case Where::kStatic:
        break;
    }
    if (o.index < p_.num_named_statics_) return "s" + std::to_string(o.index);
    const auto& enums = p_.text_.literal_enums;
    const auto k = static_cast<size_t>(o.index);
    return literal(p_.statics_[k], k < enums.size() ? enums[k] : Enum::kNone);
  }

  // ` <operand>` for each of `args`.
  std::string operands(const std::vector<Operand>& args, size_t from = 0,
                       size_t to = SIZE_MAX) const {
    std::string out;
    for (size_t i = from; i < args.size() && i < to; ++i) out += " " + operand(args[i]);
    return out;
  }

  // Fixed ints, or the operand that holds them.
  std::string ints_or_operand(const Step& s, int8_t arg, const std::vector<int64_t>& fixed) const {
    return arg < 0 ? ints(fixed) : operand(s.instr.args[arg]);
  }

  // `r2`, `r3, _` or `r3,` (a one-value unpack); statics (`s<k>`) in setup.
  static std::string outputs(const Instr& in, char kind) {
    std::string out;
    for (const int32_t o : in.outs) {
      if (!out.empty()) out += ", ";
      out += o < 0 ? "_" : kind + std::to_string(o);
    }
    return out + (in.unpack && in.outs.size() == 1 ? "," : "");
  }

  std::string step(const Step& s, char kind) const {
    const std::string text = instruction(s, kind);
    return s.comment.empty() ? text : text + "  # " + s.comment;
  }

  std::string instruction(const Step& s, char kind) const {
    const Instr& in = s.instr;
    switch (in.kind) {
      case Instr::Kind::kFree:
        return "free" + operands(in.args);
      case Instr::Kind::kReturn:
        return "return " + p_.return_form_ + operands(in.args);
      case Instr::Kind::kGuard:
        break;  // guards are no steps (Text::guards)
      default:
        return outputs(in, kind) + " = " + right_side(s);
    }
    TORCH_CHECK(false, "opgen executor program: a guard step");
  }

  // What follows `<outputs> = `.
  std::string right_side(const Step& s) const {
    const Instr& in = s.instr;
    switch (in.kind) {
      case Instr::Kind::kCall:
        return s.kernel + operands(in.args);
      case Instr::Kind::kOp:
        return operator_call(s);
      case Instr::Kind::kExtern: {
        const size_t named = in.args.size() - s.keywords.size();
        std::string out = "call " + p_.extern_names_[s.callee] + operands(in.args, 0, named);
        for (size_t i = named; i < in.args.size(); ++i)
          out += " " + s.keywords[i - named] + "=" + operand(in.args[i]);
        return out;
      }
      case Instr::Kind::kAlloc:
        return "empty_strided " + ints_or_operand(s, s.sizes_arg, s.sizes) + " " +
               ints_or_operand(s, s.strides_arg, s.strides) + " torch." +
               dtype_name(s.options.dtype().toScalarType()) + " device(" +
               s.options.device().str() + ")";
      case Instr::Kind::kView:
        return "as_strided " + operand(in.args[0]) + " " +
               ints_or_operand(s, s.sizes_arg, s.sizes) + " " +
               ints_or_operand(s, s.strides_arg, s.strides) + " " +
               (s.offset_arg < 0 ? std::to_string(s.offset) : operand(in.args[s.offset_arg]));
      case Instr::Kind::kList:
        return "list" + operands(in.args);
      case Instr::Kind::kSize:
        return "size " + operand(in.args[0]) + " " + std::to_string(s.offset);
      case Instr::Kind::kSym:
        return "sym" + postfix(s);
      default:
        TORCH_CHECK(false, "opgen executor program: no assignment form for this instruction");
    }
  }

  // `op <ns>::<name>.<overload>`, the first `positional` operands, then the named ones.
  std::string operator_call(const Step& s) const {
    const c10::FunctionSchema& schema = s.op->schema();
    const auto& overload = schema.overload_name();
    std::string out = "op " + schema.name() + "." + (overload.empty() ? "default" : overload) +
                      operands(s.instr.args, 0, static_cast<size_t>(s.positional));
    const auto& arguments = schema.arguments();
    for (const std::string& key : s.keywords) {
      size_t k = 0;
      while (k < arguments.size() && arguments[k].name() != key) ++k;
      TORCH_CHECK(k < s.instr.args.size(), "opgen executor program: no argument ", key);
      out += " " + key + "=" + operand(s.instr.args[k]);
    }
    return out;
  }

  // ` <operand or operator>...`, in the order the stack machine runs them.
  std::string postfix(const Step& s) const {
    static constexpr std::string_view kOperators[] = {"",  "+",  "-",   "*",   "//",
                                                      "%", "**", "min", "max", "neg"};
    std::string out;
    for (const SymOp& op : s.sym) {
      out += " ";
      out += op.code == SymOp::kPush ? operand(s.instr.args[op.arg])
                                     : std::string(kOperators[op.code]);
    }
    return out;
  }

  const Program& p_;
  std::string out_;
};

std::string print_program(const Program& program) { return Printer(program).print(); }

}  // namespace opgen::exec
