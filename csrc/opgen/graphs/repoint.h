// Repointing a captured CUDA graph at other tensors: the kernel arguments that hold an input's
// addresses are rewritten, so one capture serves the input wherever the caller's tensor lives, with
// no copy in or out (opgen.runtime.execution.cuda_graphs: inputs the graph writes, such as a KV cache
// that each generate() call allocates anew). Compiled only into CUDA builds (OPGEN_WITH_CUDA).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace opgen {

// The memory an input's elements span at capture, [start, end): start is its first element's address.
struct InputRange {
  uintptr_t start = 0, end = 0;
};

// The kernel nodes of one graph that take an input's addresses among their arguments, and how to
// rewrite them. Made by `scan`; `apply` points them at new addresses.
class Repointer {
 public:
  // Finds every argument word (8 bytes, 8-aligned) of every kernel node of `graph` that falls inside one
  // of `ranges`. Returns the reason where the graph cannot be repointed safely: a copy or memset node
  // touching an input, a nested graph or a node of another kind, a kernel whose arguments cannot be
  // read, a word inside two inputs.
  static std::optional<std::string> scan(cudaGraph_t graph, const std::vector<InputRange>& ranges, Repointer& out);

  // Points the arguments at `data` (each input's first element now), in `graph`'s nodes that take an input
  // whose address changed.
  void apply(const std::vector<uintptr_t>& data);

  size_t nodes() const { return patches_.size(); }
  // Each input's first element, as the nodes hold it now.
  const std::vector<uintptr_t>& addresses() const { return current_; }

 private:
  struct Word {
    size_t param;     // which argument (or 0: the one buffer of a launch through `extra`)
    size_t offset;    // byte offset in it
    size_t input;     // whose address it holds
    intptr_t delta;   // from that input's first element
  };
  struct Patch {
    CUgraphNode node = nullptr;
    CUDA_KERNEL_NODE_PARAMS params{};
    std::vector<std::vector<uint8_t>> values;  // each argument's bytes (through `extra`: one buffer)
    std::vector<void*> pointers;               // kernelParams: each argument's bytes
    std::vector<void*> extra;                  // a launch through `extra`: its list, pointing at values[0]
    size_t extra_size = 0;
    std::vector<Word> words;
  };
  std::vector<Patch> patches_;
  std::vector<uintptr_t> current_;  // the addresses the nodes hold now
};

}  // namespace opgen
