// run_package <package> <output prefix> <input files...> [--double | --repeat=N]: runs an opgen
// package with no Python in the process. Inputs are raw bytes in the layout the package's inputs
// have; output k goes to <prefix><k>.bin (contiguous bytes) and its dtype and shape to stdout.
// --double passes the inputs as float64 (to see Package::run refuse them); --repeat=N runs the
// package N more times after the first and prints the mean time per run (a C++ caller's per-call
// time, for `python -m opgen.bench graphs`' hand-written loop to compare with).
#include <ATen/ops/empty_strided.h>
#include <opgen/package/package.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: run_package <package> <output prefix> <input files...>\n";
    return 2;
  }
  const std::string last = argv[argc - 1];
  const bool as_double = last == "--double";
  const long repeats = last.rfind("--repeat=", 0) == 0 ? std::stol(last.substr(9)) : 0;
  argc -= as_double || repeats > 0 ? 1 : 0;
  try {
    const auto start = std::chrono::steady_clock::now();
    opgen::Package pkg(argv[1]);
    const auto loaded = std::chrono::steady_clock::now();
    std::vector<at::Tensor> inputs;
    for (size_t k = 0; k < pkg.inputs().size() && 3 + k < static_cast<size_t>(argc); ++k) {
      const opgen::PackageInput& spec = pkg.inputs()[k];
      at::Tensor t =
          at::empty_strided(spec.sizes, spec.strides, at::TensorOptions().dtype(spec.dtype));
      std::ifstream in(argv[3 + k], std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (bytes.size() != t.nbytes()) {
        std::cerr << "input " << k << ": " << bytes.size() << " bytes, expected " << t.nbytes()
                  << "\n";
        return 2;
      }
      std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      inputs.push_back(as_double ? t.to(at::kDouble) : t);
    }
    const auto ready = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = pkg.run(inputs);
    const auto ran = std::chrono::steady_clock::now();
    for (size_t k = 0; k < outputs.size(); ++k) {
      const at::Tensor out = outputs[k].contiguous();
      std::ofstream(std::string(argv[2]) + std::to_string(k) + ".bin", std::ios::binary)
          .write(static_cast<const char*>(out.data_ptr()),
                 static_cast<std::streamsize>(out.nbytes()));
      std::cout << "output " << k << " " << out.scalar_type() << " " << out.sizes() << "\n";
    }
    using ms = std::chrono::duration<double, std::milli>;
    if (repeats > 0) {  // each run's outputs are freed by the next, as a caller dropping them would
      const auto first = std::chrono::steady_clock::now();
      for (long i = 0; i < repeats; ++i) outputs = pkg.run(inputs);
      const double us = ms(std::chrono::steady_clock::now() - first).count() * 1000.0 / repeats;
      std::cout << "us_per_run " << us << "\n";
    }
    std::cout << "load_ms " << ms(loaded - start).count() << " first_run_ms "
              << ms(ran - ready).count() << "\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
