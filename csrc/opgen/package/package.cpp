// The package reader and runner (package.h): one reader for both faces, the C++ `Package` and
// Python's `opgen.load_package` (executor_py.cpp's `read_package`).
#include "opgen/package/package.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string_view>
#include <utility>

#include "opgen/exec/executor.h"

namespace opgen {

namespace exec {
extern const char kThunkDigest[];  // generated: thunk_tables.cpp
}

const char* thunk_digest() { return exec::kThunkDigest; }

namespace {

// CRC-32C (Castagnoli), the checksum of package format 2: SSE 4.2's crc32 instruction where the CPU
// has it (5 ms for ResNet-18's 47 MB of weights, against 23 ms for zlib's CRC-32 eight bytes at a
// time), else eight bytes at a time through tables.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

const CrcTables& crc_tables() {
  static const CrcTables tables = [] {
    CrcTables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (size_t k = 1; k < 8; ++k) {
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    }
    return t;
  }();
  return tables;
}

uint32_t crc32c_tables(const unsigned char* p, size_t n) {
  const CrcTables& t = crc_tables();
  uint32_t crc = ~0u;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, p, 4);  // little-endian hosts
    std::memcpy(&b, p + 4, 4);
    a ^= crc;
    crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^
          t[3][b & 0xFF] ^ t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t n) {
  uint64_t crc = ~0u;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v = 0;
    std::memcpy(&v, p, 8);
    crc = __builtin_ia32_crc32di(crc, v);
  }
  auto c = static_cast<uint32_t>(crc);
  for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
  return ~c;
}
#endif

// A dtype's name as packages and programs write it (float32), or ATen's (Float) for others.
std::string dtype_name(at::ScalarType type) {
  for (const auto& [name, t] : exec::dtypes_by_name()) {
    if (t == type) return std::string(name);
  }
  return c10::toString(type);
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i == line.size() || line[i] == ' ') {
      if (i > start) out.push_back(line.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// A package file mapped into memory, private and copy-on-write: constants are tensors over its
// pages (no copy, no zero-filled allocation), and a program that writes one writes its own copy.
// Files are replaced by renaming a new one into place (opgen.package does), never rewritten where
// they lie, so a loaded package's pages stay what was checked.
class Mapping {
 public:
  Mapping(const std::string& path, const std::function<void(const std::string&)>& fail) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open it for reading (" + std::string(std::strerror(errno)) + ")");
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) fail("cannot map it (" + std::string(std::strerror(errno)) + ")");
      data_ = static_cast<char*>(p);
      // Read in order, once (the checksums); no MAP_POPULATE: on a writable private mapping it
      // would copy every page.
      ::madvise(data_, size_, MADV_WILLNEED);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

// Reads one file; every error names it.
class Reader {
 public:
  explicit Reader(std::string path)
      : path_(std::move(path)),
        map_(std::make_shared<Mapping>(path_, [this](const std::string& w) { fail(w); })),
        size_(map_->size()) {}

  PackageContents read() {
    header();
    PackageContents c;
    c.torch_version = field("torch", 1)[0];
    c.thunk_digest = field("thunks", 1)[0];
    c.kernel_ops_build_id = field("kernel_ops", 1)[0];
    c.name = field("name", 1)[0];
    const auto output = field("output", 2);
    c.output_form = output[0];
    c.output_tree = output[1] == "-" ? "" : output[1];
    check_versions(c);
    const auto program = field("program", 3);
    const uint64_t length = number(program[1]);
    c.program.assign(span(number(program[0]), length, number(program[2], 16), "program"), length);
    refuse_python_only(c.program);
    for (const auto& record : constants_) {
      c.constant_keys.push_back(record[0]);
      c.constants.push_back(constant(record));
    }
    return c;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PackageError("opgen package " + path_ + ": " + what);
  }

  // What only a Python process can give a program: functions bound at load time (its `extern`
  // lines: Python callables, Triton launchers) and object inputs (`input r1 spec opaque`: the
  // DTensor specs torch.compile passes). A package, which runs without Python, has neither.
  void refuse_python_only(std::string_view program) const {
    std::string externs, objects;
    for (size_t at = 0; at < program.size();) {
      const size_t end = std::min(program.find('\n', at), program.size());
      const std::string_view line = program.substr(at, end - at);
      if (line.substr(0, 7) == "extern ")
        externs += (externs.empty() ? "" : ", ") + std::string(line.substr(7));
      constexpr std::string_view kOpaque = " opaque";
      if (line.substr(0, 6) == "input " && line.size() > kOpaque.size() &&
          line.substr(line.size() - kOpaque.size()) == kOpaque) {
        const size_t name = line.find(' ', 6) + 1;
        objects += (objects.empty() ? "'" : ", '") +
                   std::string(line.substr(name, line.size() - kOpaque.size() - name)) + "'";
      }
      at = end + 1;
    }
    if (!externs.empty()) {
      fail("its program calls functions bound at load time (" + externs +
           "), which a package running without Python cannot have");
    }
    if (!objects.empty()) {
      fail("its program takes the object input(s) " + objects +
           " (torch.compile's DTensor specs); a package takes tensors only");
    }
  }

  uint64_t number(std::string_view s, int base = 10) const {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (ec != std::errc() || end != s.data() + s.size())
      fail("corrupt header: not a number: " + std::string(s));
    return v;
  }

  std::string unescape(std::string_view s) const {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '%') {
        out.push_back(s[i]);
        continue;
      }
      if (i + 2 >= s.size()) fail("corrupt header: a bad % escape in " + std::string(s));
      out.push_back(static_cast<char>(number(s.substr(i + 1, 2), 16)));
      i += 2;
    }
    return out;
  }

  // The first line and the header lines, checked: magic, format, size, checksum.
  void header() {
    const std::string_view file(map_->data(), size_);
    const std::string_view first = file.substr(0, std::min<size_t>(file.find('\n'), 128));
    const std::string_view magic = "opgen-package ";
    if (first.substr(0, magic.size()) != magic) {
      fail(
          "not an opgen package (it does not start with `opgen-package`; write one with "
          "opgen.package())");
    }
    const auto w = words(first);
    if (w.size() != 4 || first.size() == file.size())
      fail("corrupt first line: " + std::string(first));
    const uint64_t format = number(w[1]);
    if (format != kPackageFormat) {
      fail("written in package format " + std::to_string(format) + "; this opgen reads format " +
           std::to_string(kPackageFormat) + " (package the model again with this opgen)");
    }
    const uint64_t length = number(w[2]);
    const uint64_t start = first.size() + 1;
    if (start + length > size_) truncated(start + length);
    const std::string_view text = file.substr(start, length);
    if (crc32c(text.data(), text.size()) != number(w[3], 16))
      fail("corrupt header (checksum mismatch)");
    for (std::string_view line : words_by_line(text)) {
      auto tokens = words(line);
      if (tokens.empty()) continue;
      std::vector<std::string> values;
      for (size_t i = 1; i < tokens.size(); ++i) values.push_back(unescape(tokens[i]));
      if (tokens[0] == "constant") {
        constants_.push_back(std::move(values));
      } else {
        fields_[std::string(tokens[0])] = std::move(values);
      }
    }
    data_start_ = (start + length + kPackageAlign - 1) / kPackageAlign * kPackageAlign;
    const uint64_t expected = data_start_ + number(field("data", 1)[0]);
    if (size_ < expected) truncated(expected);
    if (size_ > expected) {
      fail("corrupt: " + std::to_string(size_) + " bytes where the header says " +
           std::to_string(expected));
    }
  }

  static std::vector<std::string_view> words_by_line(std::string_view text) {
    std::vector<std::string_view> out;
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
      if (i == text.size() || text[i] == '\n') {
        out.push_back(text.substr(start, i - start));
        start = i + 1;
      }
    }
    return out;
  }

  [[noreturn]] void truncated(uint64_t expected) const {
    fail("truncated: " + std::to_string(size_) + " bytes, expected " + std::to_string(expected) +
         " (an interrupted copy or write?)");
  }

  const std::vector<std::string>& field(const std::string& name, size_t count) const {
    const auto it = fields_.find(name);
    if (it == fields_.end()) fail("corrupt header: no `" + name + "` line");
    if (it->second.size() != count) fail("corrupt header: a malformed `" + name + "` line");
    return it->second;
  }

  void check_versions(const PackageContents& c) const {
    const std::string_view made =
        std::string_view(c.torch_version).substr(0, c.torch_version.find('+'));
    if (made != TORCH_VERSION) {
      fail("made with torch " + c.torch_version + ", but this runtime has torch " +
           std::string(TORCH_VERSION) + " (package the model again with this torch)");
    }
    if (c.thunk_digest != thunk_digest()) {
      fail("made for another op spec: its program calls the kernels of thunks " + c.thunk_digest +
           " (kernel_ops build " + c.kernel_ops_build_id + "), but this runtime's thunks are " +
           thunk_digest() +
           " (package the model again with the opgen build, or ops.yaml, this runtime was built "
           "from)");
    }
  }

  // The `length` bytes at `offset` in the data, checked against `crc`.
  char* span(uint64_t offset, uint64_t length, uint64_t crc, const std::string& what) const {
    const uint64_t data = size_ - data_start_;
    if (offset > data || length > data - offset)
      fail("corrupt header: " + what + " lies past the end");
    char* out = map_->data() + data_start_ + offset;
    if (crc32c(out, length) != crc) fail("corrupt: " + what + " fails its checksum");
    return out;
  }

  std::vector<int64_t> ints(const std::string& s) const {
    if (s.size() < 2 || s.front() != '[' || s.back() != ']')
      fail("corrupt header: not a list: " + s);
    std::vector<int64_t> out;
    std::string_view body(s.data() + 1, s.size() - 2);
    size_t start = 0;
    for (size_t i = 0; i <= body.size(); ++i) {
      if (i == body.size() || body[i] == ',') {
        if (i > start) out.push_back(static_cast<int64_t>(number(body.substr(start, i - start))));
        start = i + 1;
      }
    }
    return out;
  }

  // `constant <key> <dtype> [sizes] [strides] <offset> <bytes> <crc32c>`: a tensor over the file's
  // pages, keeping the mapping alive.
  at::Tensor constant(const std::vector<std::string>& r) {
    if (r.size() != 7) fail("corrupt header: a malformed `constant` line");
    const std::string what = "constant '" + r[0] + "'";
    const auto dtype = exec::dtypes_by_name().find(r[1]);
    if (dtype == exec::dtypes_by_name().end()) fail(what + " has an unknown dtype " + r[1]);
    const auto sizes = ints(r[2]);
    const auto strides = ints(r[3]);
    if (sizes.size() != strides.size())
      fail("corrupt header: " + what + " has sizes and strides of different ranks");
    int64_t span_elements = 1;  // the elements its sizes and strides cover, from the first
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] == 0) span_elements = 0;
      if (span_elements != 0) span_elements += (sizes[d] - 1) * strides[d];
    }
    const uint64_t length = number(r[5]);
    const uint64_t offset = number(r[4]);
    const auto itemsize = static_cast<uint64_t>(c10::elementSize(dtype->second));
    if (length != static_cast<uint64_t>(span_elements) * itemsize)
      fail("corrupt header: " + what + " has " + std::to_string(length) + " bytes for its sizes");
    if (offset % kPackageAlign != 0) fail("corrupt header: " + what + " is not aligned");
    char* data = span(offset, length, number(r[6], 16), what);
    const auto options = at::TensorOptions().dtype(dtype->second);
    if (length == 0) return at::empty_strided(sizes, strides, options);
    return at::from_blob(data, sizes, strides, [map = map_](void*) {}, options);
  }

  std::string path_;
  std::shared_ptr<Mapping> map_;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;  // where the data (program, constants) starts: offsets count from here
  std::map<std::string, std::vector<std::string>> fields_;
  std::vector<std::vector<std::string>> constants_;
};

std::string ints_text(c10::IntArrayRef v) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  out << ']';
  return out.str();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return crc32c_sse42(p, n);
#endif
  return crc32c_tables(p, n);
}

PackageContents read_package(const std::string& path) { return Reader(path).read(); }

Package::Package(const std::string& path) : path_(path) {
  PackageContents c = read_package(path);
  name_ = c.name;
  output_form_ = c.output_form;
  try {
    program_ = exec::Program::parse(c.program);
  } catch (const std::exception& e) {
    throw PackageError("opgen package " + path + ": its program does not run here: " + e.what());
  }
  if (program_->dynamic()) {
    throw PackageError("opgen package " + path +
                       ": its program has symbolic input sizes; packages hold static shapes");
  }
  try {
    program_->bind(c.constants);
  } catch (const std::exception& e) {
    throw PackageError("opgen package " + path + ": its program does not run here: " + e.what());
  }
  for (const exec::InputSpec& s : program_->inputs())
    inputs_.push_back({s.name, s.dtype, s.device, s.sizes, s.strides});
}

Package::~Package() = default;
Package::Package(Package&&) noexcept = default;
Package& Package::operator=(Package&&) noexcept = default;

std::vector<at::Tensor> Package::run(const std::vector<at::Tensor>& inputs) const {
  const auto& specs = program_->inputs();
  // The messages are built only when a check fails: a call of a small program takes about a
  // microsecond, and the strings cost as much.
  const auto where = [&] { return "opgen package " + name_ + " (" + path_ + "): "; };
  if (inputs.size() != specs.size()) {
    throw PackageError(where() + "takes " + std::to_string(specs.size()) + " input tensors, got " +
                       std::to_string(inputs.size()));
  }
  exec::Registers regs = program_->registers();
  exec::BorrowedInputs borrowed(regs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const exec::InputSpec& s = specs[i];
    const at::Tensor& t = inputs[i];
    const auto input = [&] {
      return where() + "input '" + s.name + "' (position " + std::to_string(i + 1) + "): ";
    };
    if (!t.defined()) throw PackageError(input() + "an undefined tensor");
    if (t.layout() != at::kStrided)
      throw PackageError(input() + "must be a dense (strided) tensor");
    if (t.scalar_type() != s.dtype) {
      throw PackageError(input() + "expected dtype " + dtype_name(s.dtype) + ", got " +
                         dtype_name(t.scalar_type()));
    }
    if (t.device() != s.device)
      throw PackageError(input() + "expected a tensor on " + s.device.str() + ", got one on " +
                         t.device().str());
    if (t.sizes() != c10::IntArrayRef(s.sizes)) {
      throw PackageError(input() + "expected shape " + ints_text(s.sizes) + ", got " +
                         ints_text(t.sizes()) + " (a package runs the shapes it was made for)");
    }
    if (t.strides() != c10::IntArrayRef(s.strides)) {
      throw PackageError(input() + "expected strides " + ints_text(s.strides) + ", got " +
                         ints_text(t.strides()) +
                         " (pass .contiguous() or the layout it was made with)");
    }
    borrowed.set(i, t);
  }
  exec::Results results;
  {
    const auto lock = program_->lock();
    program_->run(regs, results);
  }
  std::vector<at::Tensor> out;
  out.reserve(results.size());
  for (size_t k = 0; k < results.size(); ++k) {
    if (!results[k].isTensor())
      throw PackageError(where() + "output " + std::to_string(k) + " is not a tensor (" +
                         results[k].tagKind() + ")");
    out.push_back(std::move(results[k]).toTensor());
  }
  return out;
}

}  // namespace opgen
