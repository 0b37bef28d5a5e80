// The executor's parser: a program's text -> Program. The grammar is docs/cpp-program.md, which
// opgen.runtime.codegen.cpp prints and executor_print.cpp prints back; a change to what this file
// reads is a change to that page and to both printers. Every error names the line; kernels are
// found in the thunk registry (thunk_registry.h: the generated tables and those of registered
// extensions), torch ops in the dispatcher.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "opgen/exec/executor.h"
#include "opgen/exec/thunk_registry.h"

namespace opgen::exec {

namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == sep) {
      if (sep != ' ' || i > start) out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

const std::unordered_map<std::string_view, at::ScalarType>& dtypes_by_name() {
  static const std::unordered_map<std::string_view, at::ScalarType> map = {
      {"float64", at::kDouble},
      {"float32", at::kFloat},
      {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},
      {"int32", at::kInt},
      {"int16", at::kShort},
      {"int8", at::kChar},
      {"uint8", at::kByte},
      {"bool", at::kBool},
      {"complex64", at::kComplexFloat},
      {"complex128", at::kComplexDouble}};
  return map;
}

// Reads a program's text line by line; every error names the line.
class Parser {
 public:
  explicit Parser(Program& p) : p_(p) {}

  void parse(std::string_view text) {
    std::vector<Step>* section = nullptr;
    for (std::string_view line : split(text, '\n')) {
      ++line_no_;
      line_ = line;
      std::vector<std::string_view> tokens;
      for (std::string_view token : split(line, ' ')) {
        if (token[0] == '#') break;
        tokens.push_back(token);
      }
      if (tokens.empty()) {
        header(line);
        continue;
      }
      const std::string_view head = tokens[0];
      if (head == "program") {
        expect(tokens.size() == 6 && tokens[2] == "registers" && tokens[4] == "statics",
               "malformed program line");
        p_.name_ = std::string(tokens[1]);
        p_.range_ = "opgen::" + p_.name_ + (header_.empty() ? "" : " (" + header_ + ")");
        p_.text_.header = header_;
        p_.num_registers_ = integer(tokens[3]);
        p_.num_named_statics_ = integer(tokens[5]);
        p_.statics_.resize(p_.num_named_statics_);
        started_ = true;
        continue;
      }
      expect(started_, "the program must start with a `program` line");
      if (head == "input") {
        input(tokens);
      } else if (head == "constant") {
        expect(tokens.size() == 3 &&
                   index(tokens[1], 's') == static_cast<int32_t>(p_.constant_keys_.size()),
               "constants are `constant s<k> <key>`, numbered from s0 in order");
        p_.constant_keys_.push_back(unescape(tokens[2]));
      } else if (head == "extern") {
        expect(tokens.size() == 2, "externs are `extern <name>`");
        const std::string name(tokens[1]);
        for (const std::string& known : p_.extern_names_)
          expect(known != name, "extern " + name + " twice");
        p_.extern_names_.push_back(name);
      } else if (head == "shared") {
        expect(tokens.size() == 3, "shared setup values are `shared s<k> <name>`");
        const int32_t k = index(tokens[1], 's');
        expect(k >= static_cast<int32_t>(p_.constant_keys_.size()) && k < p_.num_named_statics_,
               "a shared value is a static setup makes");
        p_.shared_.emplace_back(k, std::string(tokens[2]));
      } else if (head == "alternative") {
        expect(tokens.size() == 3, "alternatives are `alternative <extern> <pick>`");
        const auto& names = p_.extern_names_;
        expect(std::find(names.begin(), names.end(), tokens[1]) != names.end(),
               "an alternative of " + std::string(tokens[1]) + ", which no `extern` line names");
        auto& sites = p_.alternatives_[std::string(tokens[1])][std::string(tokens[2])];
        section = &sites.emplace_back();
        p_.text_.alternatives.emplace_back(tokens[1], tokens[2]);
        section_is_body_ = true;
      } else if (head == "setup:") {
        section = &p_.setup_;
        section_is_body_ = false;
      } else if (head == "body:") {
        section = &p_.body_;
        section_is_body_ = true;
      } else if (head == "guard") {
        guard(tokens, section);
      } else if (head == "recycle") {
        recycle(tokens, section);
      } else {
        expect(section != nullptr, "an instruction before `setup:` or `body:`");
        section->push_back(step(tokens));
        Step& added = section->back();
        added.instr.text = std::string(line_.substr(line_.find_first_not_of(' ')));
        added.comment = std::string(comment_of(line));
        const bool kernel = added.instr.kind == Instr::Kind::kCall ||
                            added.instr.kind == Instr::Kind::kOp ||
                            added.instr.kind == Instr::Kind::kExtern;
        if (kernel) added.range = range_of(line);
      }
    }
    expect(started_, "empty program");
    check_recycled();
    // A program that calls externs may run Python, which can hand the GIL to another thread
    // mid-call: calls sharing persistent buffers then take the program's lock, with the GIL
    // released.
    p_.releases_gil_ |= p_.persistent_ && !p_.extern_names_.empty();
  }

 private:
  // `# @generated by opgen: <header>. Do not edit.`: the header names the graph's profiler range.
  void header(std::string_view line) {
    constexpr std::string_view kStart = "# @generated by opgen: ", kEnd = ". Do not edit.";
    const size_t at = line.find(kStart);
    if (at == std::string_view::npos || started_) return;
    std::string_view rest = line.substr(at + kStart.size());
    if (rest.size() >= kEnd.size() && rest.substr(rest.size() - kEnd.size()) == kEnd)
      rest.remove_suffix(kEnd.size());
    header_ = std::string(rest);
  }

  // A line's trailing comment: what follows `  # ` (empty where there is none).
  static std::string_view comment_of(std::string_view line) {
    const size_t at = line.find("  # ");
    return at == std::string_view::npos ? std::string_view() : line.substr(at + 4);
  }

  // A kernel call's range from its comment, `# <node>: <target>` -> `opgen::<node> (<target>)`.
  static std::string range_of(std::string_view line) {
    const size_t at = line.find("  # ");
    if (at == std::string_view::npos) return "";
    const std::string_view comment = line.substr(at + 4);
    const size_t colon = comment.find(": ");
    if (colon == std::string_view::npos) return "opgen::" + std::string(comment);
    return "opgen::" + std::string(comment.substr(0, colon)) + " (" +
           std::string(comment.substr(colon + 2)) + ")";
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw std::invalid_argument("opgen executor program, line " + std::to_string(line_no_) + ": " +
                                message + " (in: " + std::string(line_) + ")");
  }
  void expect(bool condition, const std::string& message) const {
    if (!condition) fail(message);
  }

  int32_t integer(std::string_view s) const {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    expect(ec == std::errc() && end == s.data() + s.size(), "not an integer: " + std::string(s));
    return static_cast<int32_t>(v);
  }

  int32_t index(std::string_view s, char kind) const {
    expect(s.size() > 1 && s[0] == kind,
           std::string("expected ") + kind + "<k>, got " + std::string(s));
    const int32_t k = integer(s.substr(1));
    const int32_t limit = kind == 'r' ? p_.num_registers_ : p_.num_named_statics_;
    expect(k >= 0 && k < limit, "index out of range: " + std::string(s));
    return k;
  }

  std::string unescape(std::string_view s) const {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%') {
        expect(i + 2 < s.size(), "a `%` escape needs two hex digits");
        int byte = 0;
        const auto [end, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, byte, 16);
        expect(ec == std::errc() && end == s.data() + i + 3, "a `%` escape needs two hex digits");
        out.push_back(static_cast<char>(byte));
        i += 2;
      } else {
        out.push_back(s[i]);
      }
    }
    return out;
  }

  // `[4,16]`; with `symbolic`, `?` stands for a size known per call (-1).
  std::vector<int64_t> ints(std::string_view s, bool symbolic = false) {
    expect(s.size() >= 2 && s.front() == '[' && s.back() == ']',
           "expected a list of ints, got " + std::string(s));
    std::vector<int64_t> out;
    for (std::string_view item : split(s.substr(1, s.size() - 2), ',')) {
      if (symbolic && item == "?") {
        p_.dynamic_ = true;
        out.push_back(-1);
      } else if (!item.empty()) {
        out.push_back(integer(item));
      }
    }
    return out;
  }

  static bool is_register(std::string_view s) {
    return s.size() > 1 && (s[0] == 'r' || s[0] == 's') &&
           std::isdigit(static_cast<unsigned char>(s[1]));
  }

  // Fixed ints (`[4,16]`, `0`) into `fixed`, or a register holding them: its operand index in
  // `slot`.
  void ints_or_register(Step& s, std::string_view token, std::vector<int64_t>& fixed,
                        int8_t& slot) {
    if (!is_register(token)) {
      fixed = ints(token);
      return;
    }
    slot = static_cast<int8_t>(s.instr.args.size());
    s.instr.args.push_back(operand(token));
  }

  c10::IValue literal(std::string_view s) const {
    if (s == "None") return c10::IValue();
    if (s == "True" || s == "False") return c10::IValue(s == "True");
    if (s.front() == '\'') {
      expect(s.size() >= 2 && s.back() == '\'', "unterminated string");
      return c10::IValue(unescape(s.substr(1, s.size() - 2)));
    }
    if (s.front() == '[') return list(s);
    if (starts_with(s, "device("))
      return c10::IValue(c10::Device(std::string(s.substr(7, s.size() - 8))));
    switch (enum_kind(s)) {
      case Enum::kDtype: {
        const auto it = dtypes_by_name().find(s.substr(6));
        expect(it != dtypes_by_name().end(), "unknown dtype " + std::string(s));
        return c10::IValue(it->second);
      }
      case Enum::kLayout:
        expect(s == "layout(strided)", "unsupported layout " + std::string(s));
        return c10::IValue(at::kStrided);
      case Enum::kMemoryFormat: {
        const std::string_view m = s.substr(14, s.size() - 15);
        if (m == "contiguous_format") return c10::IValue(at::MemoryFormat::Contiguous);
        if (m == "preserve_format") return c10::IValue(at::MemoryFormat::Preserve);
        if (m == "channels_last") return c10::IValue(at::MemoryFormat::ChannelsLast);
        if (m == "channels_last_3d") return c10::IValue(at::MemoryFormat::ChannelsLast3d);
        fail("unknown memory format " + std::string(s));
      }
      case Enum::kNone:
        break;
    }
    return number(s);
  }

  // Which enum a literal names (`torch.float32`, `layout(strided)`, `memory_format(...)`), which
  // its register holds as a number only; kNone for any other operand.
  static Enum enum_kind(std::string_view s) {
    if (starts_with(s, "torch.")) return Enum::kDtype;
    if (starts_with(s, "layout(")) return Enum::kLayout;
    if (starts_with(s, "memory_format(")) return Enum::kMemoryFormat;
    return Enum::kNone;
  }

  c10::IValue number(std::string_view s) const {
    const bool is_float =
        s.find_first_of(".eEn") != std::string_view::npos;  // 1.5, 1e-05, inf, nan
    if (!is_float) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      expect(ec == std::errc() && end == s.data() + s.size(), "not a literal: " + std::string(s));
      return c10::IValue(v);
    }
    const std::string text(s);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    expect(end == text.c_str() + text.size(), "not a literal: " + text);
    return c10::IValue(v);
  }

  c10::IValue list(std::string_view s) const {
    expect(s.back() == ']', "unterminated list " + std::string(s));
    std::vector<c10::IValue> items;
    for (std::string_view item : split(s.substr(1, s.size() - 2), ',')) {
      if (item.empty()) continue;
      expect(item[0] != 'r' && item[0] != 's' && item[0] != '[',
             "a list literal holds literals only");
      items.push_back(literal(item));
    }
    bool all_int = true, all_bool = true, all_num = true;
    for (const auto& v : items) {
      all_int &= v.isInt();
      all_bool &= v.isBool();
      all_num &= v.isInt() || v.isDouble();
    }
    if (all_bool && !items.empty()) {
      c10::List<bool> out;
      for (const auto& v : items) out.push_back(v.toBool());
      return c10::IValue(out);
    }
    if (all_int) {
      c10::List<int64_t> out;
      for (const auto& v : items) out.push_back(v.toInt());
      return c10::IValue(out);
    }
    if (all_num) {
      c10::List<double> out;
      for (const auto& v : items)
        out.push_back(v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble());
      return c10::IValue(out);
    }
    c10::impl::GenericList out(c10::AnyType::get());
    for (auto& v : items) out.push_back(std::move(v));
    return c10::IValue(out);
  }

  Operand operand(std::string_view s) {
    if (s == "_") return {Where::kMissing, 0};
    if (is_register(s)) return {s[0] == 'r' ? Where::kRegister : Where::kStatic, index(s, s[0])};
    p_.statics_.push_back(literal(s));
    auto& enums = p_.text_.literal_enums;  // by static: what its literal names (for the printer)
    enums.resize(p_.statics_.size() - 1, Enum::kNone);
    enums.push_back(enum_kind(s));
    return {Where::kStatic, static_cast<int32_t>(p_.statics_.size() - 1)};
  }

  void input(const std::vector<std::string_view>& t) {
    if (t.size() == 4 && t[3] == "int") {  // a size passed as an int (torch.compile's SymInts)
      expect(index(t[1], 'r') == static_cast<int32_t>(p_.inputs_.size()),
             "inputs are numbered from r0 in order");
      p_.dynamic_ = true;
      p_.inputs_.push_back({unescape(t[2]), at::kLong, c10::Device("cpu"), {}, {}, true});
      return;
    }
    if (t.size() == 4 && t[3] == "opaque") {  // an object the program never reads (DTensor specs)
      expect(index(t[1], 'r') == static_cast<int32_t>(p_.inputs_.size()),
             "inputs are numbered from r0 in order");
      InputSpec spec{unescape(t[2]), at::kLong, c10::Device("cpu"), {}, {}};
      spec.opaque = true;
      p_.inputs_.push_back(std::move(spec));
      return;
    }
    expect(t.size() == 7 && index(t[1], 'r') == static_cast<int32_t>(p_.inputs_.size()),
           "inputs are `input r<k> <name> <dtype> <device> [sizes] [strides]` (or `input r<k> "
           "<name> int|opaque`), numbered from r0 in order");
    const auto dtype = dtypes_by_name().find(t[3]);
    expect(dtype != dtypes_by_name().end(), "unknown dtype " + std::string(t[3]));
    p_.inputs_.push_back({unescape(t[2]), dtype->second, c10::Device(std::string(t[4])),
                          ints(t[5], true), ints(t[6], true)});
  }

  // `recycle <k> <out= call>`: the out= form of the line before, which makes return value k.
  void recycle(const std::vector<std::string_view>& t, std::vector<Step>* section) {
    expect(section == &p_.body_ && !section->empty() && t.size() > 3,
           "`recycle <k> <out= call>` follows the body line that makes return value k");
    Step& maker = section->back();
    expect(maker.instr.kind == Instr::Kind::kCall && maker.instr.outs.size() == 1 &&
               maker.instr.outs[0] >= 0 && maker.recycle < 0,
           "a recycled value is the one result of a kernel call");
    Step out = step(std::vector<std::string_view>(t.begin() + 2, t.end()));
    const auto& outs = out.instr.outs;
    expect(out.instr.kind == Instr::Kind::kCall &&
               std::all_of(outs.begin(), outs.end(), [](int32_t o) { return o < 0; }),
           "a recycle line is a kernel call that makes nothing (`_ = <op>_out ...`)");
    out.instr.text = std::string(line_.substr(line_.find_first_not_of(' ')));
    out.comment = std::string(comment_of(line_));
    maker.recycle = static_cast<int32_t>(p_.recycles_.size());
    maker.result = integer(t[1]);
    expect(maker.result >= 0, "a return value's index");
    p_.recycles_.push_back(std::move(out));
    p_.recyclable_.push_back(maker.result);
  }

  // A recycled value's register borrows the host's tensor (Program::run): nothing after its maker
  // may write or free that register, its recycle line writes into it, and the return line returns
  // it once, as the value the `recycle` line names.
  void check_recycled() const {
    const auto& body = p_.body_;
    const auto ret = std::find_if(body.rbegin(), body.rend(), [](const Step& s) {
      return s.instr.kind == Instr::Kind::kReturn;
    });
    for (auto maker = body.begin(); maker != body.end(); ++maker) {
      if (maker->recycle < 0) continue;
      const int32_t r = maker->instr.outs[0];
      const auto is_r = [r](const Operand& o) {
        return o.where == Where::kRegister && o.index == r;
      };
      const std::string what = "recycled r" + std::to_string(r) + " (" + maker->instr.text + ")";
      const auto& written = p_.recycles_[maker->recycle].instr.args;
      if (std::none_of(written.begin(), written.end(), is_r))
        throw std::invalid_argument("opgen executor program: the recycle line of " + what +
                                    " does not write into it");
      const auto touches = [&](const Step& s) {
        const auto& outs = s.instr.outs;
        return std::find(outs.begin(), outs.end(), r) != outs.end() ||
               (s.instr.kind == Instr::Kind::kFree &&
                std::any_of(s.instr.args.begin(), s.instr.args.end(), is_r));
      };
      bool later = std::any_of(maker + 1, body.end(), touches);
      for (const auto& [name, picks] : p_.alternatives_) {
        for (const auto& [pick, sites] : picks) {
          for (const auto& lines : sites) later |= std::any_of(lines.begin(), lines.end(), touches);
        }
      }
      if (later)
        throw std::invalid_argument("opgen executor program: a line after " + what +
                                    " writes or frees it");
      const auto& returned = ret == body.rend() ? std::vector<Operand>{} : ret->instr.args;
      const bool once = std::count_if(returned.begin(), returned.end(), is_r) == 1 &&
                        static_cast<size_t>(maker->result) < returned.size() &&
                        is_r(returned[maker->result]);
      if (!once)
        throw std::invalid_argument("opgen executor program: " + what + " is not return value " +
                                    std::to_string(maker->result) + ", once");
    }
  }

  void guard(const std::vector<std::string_view>& t, const std::vector<Step>* section) {
    expect(section == &p_.body_, "a guard belongs in the body");
    p_.guarded_ = true;
    Program::Text::Guard& line = p_.text_.guards.emplace_back();
    line.at = p_.body_.size();
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i] == "grad") {
        p_.grad_guard_ = line.grad = true;
      } else {
        const int32_t r = index(t[i], 'r');
        expect(r < static_cast<int32_t>(p_.inputs_.size()), "a guard checks inputs only");
        line.inputs.push_back(r);
      }
    }
  }

  // Outputs: `r2` or `r2, _, r4` (before `=`); in setup lines they are statics.
  std::vector<int32_t> outputs(const std::vector<std::string_view>& t, size_t eq) const {
    std::vector<int32_t> outs;
    for (size_t i = 0; i < eq; ++i) {
      for (std::string_view name : split(t[i], ',')) {
        if (name.empty()) continue;
        outs.push_back(name == "_" ? -1 : index(name, name[0] == 's' ? 's' : 'r'));
      }
    }
    return outs;
  }

  Step step(const std::vector<std::string_view>& t) {
    Step s;
    Instr& in = s.instr;
    if (t[0] == "free") {
      in.kind = Instr::Kind::kFree;
      for (size_t i = 1; i < t.size(); ++i) in.args.push_back(operand(t[i]));
      return s;
    }
    if (t[0] == "return") {
      expect(t.size() >= 2, "return needs a form");
      in.kind = Instr::Kind::kReturn;
      p_.return_form_ = std::string(t[1]);
      for (size_t i = 2; i < t.size(); ++i) in.args.push_back(operand(t[i]));
      return s;
    }
    size_t eq = 0;
    while (eq < t.size() && t[eq] != "=") ++eq;
    expect(eq > 0 && eq + 1 < t.size(), "expected `<outputs> = <what> <operands...>`");
    in.outs = outputs(t, eq);
    in.unpack = t[eq - 1].back() == ',' || eq > 1;
    const std::string_view what = t[eq + 1];
    std::vector<std::string_view> rest(t.begin() + eq + 2, t.end());
    if (what == "empty_strided") {
      expect(rest.size() == 4 && in.outs.size() == 1,
             "empty_strided <sizes> <strides> <dtype> <device>");
      in.kind = Instr::Kind::kAlloc;
      p_.persistent_ |= !section_is_body_;
      ints_or_register(s, rest[0], s.sizes, s.sizes_arg);
      ints_or_register(s, rest[1], s.strides, s.strides_arg);
      s.options = at::TensorOptions()
                      .dtype(literal(rest[2]).toScalarType())
                      .device(literal(rest[3]).toDevice());
    } else if (what == "as_strided") {
      expect(rest.size() == 4 && in.outs.size() == 1,
             "as_strided <source> <sizes> <strides> <offset>");
      in.kind = Instr::Kind::kView;
      in.args.push_back(operand(rest[0]));
      ints_or_register(s, rest[1], s.sizes, s.sizes_arg);
      ints_or_register(s, rest[2], s.strides, s.strides_arg);
      if (is_register(rest[3])) {
        s.offset_arg = static_cast<int8_t>(in.args.size());
        in.args.push_back(operand(rest[3]));
      } else {
        s.offset = integer(rest[3]);
      }
    } else if (what == "op") {
      expect(!rest.empty(), "op <namespace>::<name>[.<overload>] <operands...>");
      operator_call(s, rest);
    } else if (what == "call") {
      extern_call(s, rest);
    } else if (what == "size") {
      expect(rest.size() == 2 && in.outs.size() == 1, "size <input> <dim>");
      in.kind = Instr::Kind::kSize;
      in.args.push_back(operand(rest[0]));
      s.offset = integer(rest[1]);
    } else if (what == "sym") {
      expect(in.outs.size() == 1, "sym <postfix operands and operators...>");
      sym(s, rest);
    } else if (what == "list") {
      in.kind = Instr::Kind::kList;
      for (std::string_view o : rest) in.args.push_back(operand(o));
    } else {
      const size_t dot = what.rfind('.');
      expect(dot != std::string_view::npos, "a kernel is <function>.<backend>");
      // `add.cpu`: add on a CPU device, the CPU kernel's thunk or else the composite one.
      const std::string function(what.substr(0, dot));
      const std::string device(what.substr(dot + 1));
      const ThunkEntry* entry = find_thunk(function, device);
      if (entry == nullptr) entry = find_thunk(function, "default");
      expect(entry != nullptr, "no thunk for " + function + " on " + device);
      in.thunk = entry->thunk;
      s.kernel = std::string(what);
      p_.releases_gil_ |= entry->release_gil && section_is_body_;
      for (std::string_view o : rest) in.args.push_back(operand(o));
    }
    return s;
  }

  // `sym <postfix>`: operands push, operators pop two (`neg` one) and push the result.
  void sym(Step& s, const std::vector<std::string_view>& rest) {
    s.instr.kind = Instr::Kind::kSym;
    static const std::pair<std::string_view, SymOp::Code> operators[] = {
        {"+", SymOp::kAdd},       {"-", SymOp::kSub},   {"*", SymOp::kMul},
        {"//", SymOp::kFloorDiv}, {"%", SymOp::kMod},   {"**", SymOp::kPow},
        {"min", SymOp::kMin},     {"max", SymOp::kMax}, {"neg", SymOp::kNeg}};
    int depth = 0;
    for (std::string_view token : rest) {
      const auto* op = std::find_if(std::begin(operators), std::end(operators),
                                    [&](const auto& o) { return o.first == token; });
      if (op == std::end(operators)) {
        s.sym.push_back({SymOp::kPush, static_cast<int32_t>(s.instr.args.size())});
        s.instr.args.push_back(operand(token));
        ++depth;
      } else {
        depth -= op->second == SymOp::kNeg ? 0 : 1;
        expect(depth >= 1, "`" + std::string(token) + "` lacks operands");
        s.sym.push_back({op->second});
      }
      expect(depth <= 32, "a size expression deeper than 32");
    }
    expect(depth == 1, "a size expression leaves " + std::to_string(depth) + " values, not one");
  }

  // `call <extern> <positional...> <name>=<operand>...`: positional operands, then named ones.
  void extern_call(Step& s, const std::vector<std::string_view>& rest) {
    Instr& in = s.instr;
    in.kind = Instr::Kind::kExtern;
    expect(!rest.empty(), "call <extern> <operands...>");
    const auto& names = p_.extern_names_;
    const auto it = std::find(names.begin(), names.end(), rest[0]);
    expect(it != names.end(), "call of " + std::string(rest[0]) + ", which no `extern` line names");
    s.callee = static_cast<int32_t>(it - names.begin());
    for (size_t i = 1; i < rest.size(); ++i) {
      const size_t eq = rest[i].find('=');
      std::string_view text = rest[i];
      if (eq == std::string_view::npos) {
        expect(s.keywords.empty(), "positional operands come before named ones");
      } else {
        s.keywords.emplace_back(rest[i].substr(0, eq));
        text = rest[i].substr(eq + 1);
      }
      in.args.push_back(operand(text));
      s.enums.push_back(enum_kind(text));
    }
  }

  // `op <ns>::<name>[.<overload>] <positional...> <name>=<operand>...`: the operands go in schema
  // order, a missing one as the schema's default (a static).
  void operator_call(Step& s, const std::vector<std::string_view>& rest) {
    Instr& in = s.instr;
    in.kind = Instr::Kind::kOp;
    const std::string_view full = rest[0];
    const size_t dot = full.find('.');
    const std::string name(full.substr(0, dot));
    const std::string overload(dot == std::string_view::npos ? "" : full.substr(dot + 1));
    auto handle =
        c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
    expect(handle.has_value(), "no operator " + std::string(full));
    const auto& arguments = handle->schema().arguments();
    std::vector<std::optional<Operand>> slots(arguments.size());
    size_t positional = 0;
    for (size_t i = 1; i < rest.size(); ++i) {
      const size_t eq = rest[i].find('=');
      if (eq == std::string_view::npos) {
        expect(positional < arguments.size(), "too many arguments for " + std::string(full));
        slots[positional++] = operand(rest[i]);
        continue;
      }
      const std::string_view key = rest[i].substr(0, eq);
      size_t k = 0;
      while (k < arguments.size() && arguments[k].name() != key) ++k;
      expect(k < arguments.size(), std::string(full) + " has no argument " + std::string(key));
      slots[k] = operand(rest[i].substr(eq + 1));
      s.keywords.emplace_back(key);
    }
    s.positional = static_cast<int32_t>(positional);
    for (size_t k = 0; k < arguments.size(); ++k) {
      if (!slots[k]) {
        expect(arguments[k].default_value().has_value(), "no value for " + arguments[k].name());
        p_.statics_.push_back(*arguments[k].default_value());
        slots[k] = Operand{Where::kStatic, static_cast<int32_t>(p_.statics_.size() - 1)};
      }
      in.args.push_back(*slots[k]);
    }
    const bool whole = !in.unpack && !in.outs.empty() && in.outs[0] >= 0;
    expect(!whole || handle->schema().returns().size() <= 1, "a tuple result kept whole");
    s.op = *handle;
  }

  Program& p_;
  int line_no_ = 0;
  std::string_view line_;
  bool started_ = false;
  bool section_is_body_ = false;
  std::string header_;
};

std::unique_ptr<Program> Program::parse(std::string_view text) {
  auto program = std::make_unique<Program>();
  Parser(*program).parse(text);
  return program;
}

}  // namespace opgen::exec
