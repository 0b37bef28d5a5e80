// An opgen package (written by `opgen.package(model, example_inputs, path)`): one file holding a
// compiled graph's executor program, its constant tensors and the versions it was made with, run by
// the prebuilt C++ executor with libtorch only: no Python in the process.
//
//   #include <opgen/package/package.h>
//   opgen::Package pkg("model.opgen");
//   std::vector<at::Tensor> out = pkg.run({x});
//
// Every problem is an opgen::PackageError (a std::runtime_error) whose message names the file and
// what is wrong: not a package, truncated or corrupt, another package format, another torch
// version, another op spec (the thunks it was made for are not the ones linked in), wrong inputs.
// Kernel errors during `run` are c10::Errors naming the program line, as in the executor.
//
// The file (little-endian; strings %-escaped as in executor programs):
//
//   opgen-package <format> <header bytes> <header crc32c, hex>\n
//   <header: text lines>
//     torch <torch.__version__>          thunks <digest>          kernel_ops <BUILD_ID>
//     name <model>                       output <form> <pytree spec JSON or ->
//     program <offset> <bytes> <crc32c>
//     constant <key> <dtype> [sizes] [strides] <offset> <bytes> <crc32c>  (one per constant)
//     data <bytes>
//   <zero bytes up to the next multiple of 64 in the file>
//   <data: the program text and the constants' bytes, at their offsets from the data's start>
//
// Offsets are 64-byte aligned, checksums CRC-32C in hex. A constant's bytes are the span of storage
// its sizes and strides cover, from its first element. The reader maps the file: constants are
// tensors over its pages (copy-on-write), checked once when it is read.
// opgen/runtime/artifact/package_file.py writes it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace opgen {

namespace exec {
class Program;
}

class PackageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The package format this build reads and writes.
inline constexpr int kPackageFormat = 2;
// The data starts at the first multiple of this after the header; program and constants lie at
// multiples of it from there.
inline constexpr uint64_t kPackageAlign = 64;

// CRC-32C (Castagnoli) of `n` bytes: the checksum of every part of a package (Python: _C.crc32c).
uint32_t crc32c(const void* data, size_t n);

// What a package file holds, read and checked against this build (format, torch, thunks,
// checksums).
struct PackageContents {
  std::string name;                 // the model's
  std::string torch_version;        // torch.__version__ when it was made
  std::string thunk_digest;         // the thunks its program calls (opgen.gen.emit.thunk_digest)
  std::string kernel_ops_build_id;  // kernel_ops.BUILD_ID when it was made (informational)
  std::string program;              // the executor program's text (docs/cpp-program.md)
  std::vector<std::string> constant_keys;
  std::vector<at::Tensor> constants;  // in the order of the program's `constant` lines
  std::string output_form;            // single | tuple | list | pytree
  std::string output_tree;  // pytree: torch's treespec JSON (Python rebuilds the structure)
};

// Reads and checks `path`; PackageError on anything wrong with it.
PackageContents read_package(const std::string& path);

// The thunk digest of the runtime linked into this process.
const char* thunk_digest();

// What one input must be (the program was compiled for exactly this).
struct PackageInput {
  std::string name;
  at::ScalarType dtype;
  at::Device device;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

// A package, loaded: its program parsed and bound (the setup lines run: weight packing, folding).
class Package {
 public:
  explicit Package(const std::string& path);
  ~Package();
  Package(Package&&) noexcept;
  Package& operator=(Package&&) noexcept;

  // Runs the program on `inputs` (the model's tensors, flattened, in order); the outputs flattened.
  // PackageError on a wrong input count, dtype, device, shape or strides. Thread-safe.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const;

  const std::string& name() const { return name_; }
  const std::string& output_form() const { return output_form_; }
  const std::vector<PackageInput>& inputs() const { return inputs_; }

 private:
  std::unique_ptr<exec::Program> program_;
  std::string name_;
  std::string path_;
  std::string output_form_;
  std::vector<PackageInput> inputs_;
};

}  // namespace opgen
