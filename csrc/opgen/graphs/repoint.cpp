#include "opgen/graphs/repoint.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <cstring>

namespace opgen {
namespace {

// The driver calls this needs, opened with dlopen as the JIT launcher does (opgen/jit/jit_launcher.cpp).
struct Driver {
  decltype(&::cuGraphKernelNodeGetParams) getParams = nullptr;
  decltype(&::cuGraphKernelNodeSetParams) setParams = nullptr;
  decltype(&::cuFuncGetParamInfo) funcParamInfo = nullptr;
  decltype(&::cuKernelGetParamInfo) kernelParamInfo = nullptr;
  CUresult (*funcParamCount)(CUfunction, size_t*) = nullptr;  // CUDA 13 drivers; null before
  decltype(&::cuGetErrorString) errorString = nullptr;
  std::string missing;  // the first call the driver lacks, if any
};

template <class F>
void resolve(void* lib, const char* name, F& slot, std::string& missing) {
  slot = lib != nullptr ? reinterpret_cast<F>(dlsym(lib, name)) : nullptr;
  if (slot == nullptr && missing.empty()) missing = name;
}

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // local: symbols come from the handle
    resolve(lib, "cuGraphKernelNodeGetParams_v2", out.getParams, out.missing);
    resolve(lib, "cuGraphKernelNodeSetParams_v2", out.setParams, out.missing);
    resolve(lib, "cuFuncGetParamInfo", out.funcParamInfo, out.missing);
    resolve(lib, "cuKernelGetParamInfo", out.kernelParamInfo, out.missing);
    resolve(lib, "cuGetErrorString", out.errorString, out.missing);
    if (lib != nullptr) out.funcParamCount = reinterpret_cast<decltype(out.funcParamCount)>(dlsym(lib, "cuFuncGetParamCount"));
    return out;
  }();
  return d;
}

std::string error_text(CUresult result) {
  const char* message = nullptr;
  if (driver().errorString != nullptr) driver().errorString(result, &message);
  return message != nullptr ? message : "CUresult " + std::to_string(static_cast<int>(result));
}

// Each argument's size; nullopt where the driver cannot say.
std::optional<std::vector<size_t>> argument_sizes(const CUDA_KERNEL_NODE_PARAMS& p) {
  const Driver& d = driver();
  auto info = [&](size_t i, size_t* offset, size_t* size) {
    return p.func != nullptr ? d.funcParamInfo(p.func, i, offset, size) : d.kernelParamInfo(p.kern, i, offset, size);
  };
  size_t count = SIZE_MAX;  // unknown: read until the driver says there is no such argument
  if (p.func != nullptr && d.funcParamCount != nullptr && d.funcParamCount(p.func, &count) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < count; ++i) {
    size_t offset = 0, size = 0;
    const CUresult r = info(i, &offset, &size);
    if (r != CUDA_SUCCESS) {
      if (count != SIZE_MAX || r != CUDA_ERROR_INVALID_VALUE) return std::nullopt;
      break;
    }
    out.push_back(size);
  }
  return out;
}

bool overlaps(uintptr_t start, size_t bytes, const std::vector<InputRange>& ranges) {
  for (const InputRange& r : ranges) {
    if (start < r.end && start + bytes > r.start) return true;
  }
  return false;
}

// The bytes a copy node's source or destination spans (a 1-d copy: its width).
size_t copy_bytes(const cudaMemcpy3DParms& p, const cudaPitchedPtr& ptr) {
  const size_t rows = std::max<size_t>(1, p.extent.height) * std::max<size_t>(1, p.extent.depth);
  return std::max<size_t>(1, std::max(ptr.pitch, p.extent.width) * rows);
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph) {
  size_t count = 0;
  TORCH_CHECK(cudaGraphGetNodes(graph, nullptr, &count) == cudaSuccess, "opgen CUDA graph: cudaGraphGetNodes failed");
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) {
    TORCH_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count) == cudaSuccess, "opgen CUDA graph: cudaGraphGetNodes failed");
  }
  return nodes;
}

}  // namespace

std::optional<std::string> Repointer::scan(cudaGraph_t graph, const std::vector<InputRange>& ranges, Repointer& out) {
  const Driver& d = driver();
  if (!d.missing.empty()) return "the CUDA driver has no " + d.missing;
  out.patches_.clear();
  out.current_.clear();
  for (const InputRange& r : ranges) out.current_.push_back(r.start);
  for (cudaGraphNode_t node : nodes_of(graph)) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return std::string("a node's type cannot be read");
    if (type == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms p{};
      if (cudaGraphMemcpyNodeGetParams(node, &p) != cudaSuccess) return std::string("a copy node cannot be read");
      if (p.srcArray != nullptr || p.dstArray != nullptr) continue;  // arrays are never tensors
      if (overlaps(reinterpret_cast<uintptr_t>(p.srcPtr.ptr), copy_bytes(p, p.srcPtr), ranges) ||
          overlaps(reinterpret_cast<uintptr_t>(p.dstPtr.ptr), copy_bytes(p, p.dstPtr), ranges)) {
        return std::string("a copy node reads or writes a written input");
      }
      continue;
    }
    if (type == cudaGraphNodeTypeMemset) {
      cudaMemsetParams p{};
      if (cudaGraphMemsetNodeGetParams(node, &p) != cudaSuccess) return std::string("a memset node cannot be read");
      const size_t bytes = std::max<size_t>(1, std::max<size_t>(p.pitch, p.width * p.elementSize) *
                                                   std::max<size_t>(1, p.height));
      if (overlaps(reinterpret_cast<uintptr_t>(p.dst), bytes, ranges)) return std::string("a memset node writes a written input");
      continue;
    }
    if (type == cudaGraphNodeTypeEmpty || type == cudaGraphNodeTypeWaitEvent || type == cudaGraphNodeTypeEventRecord) {
      continue;
    }
    if (type != cudaGraphNodeTypeKernel) return "a node of kind " + std::to_string(static_cast<int>(type));

    Patch patch;
    patch.node = node;
    CUresult r = d.getParams(node, &patch.params);
    if (r != CUDA_SUCCESS) return "a kernel node cannot be read: " + error_text(r);
    CUDA_KERNEL_NODE_PARAMS& p = patch.params;
    if (p.kernelParams != nullptr) {
      const auto sizes = argument_sizes(p);
      if (!sizes) return std::string("a kernel's arguments cannot be listed by this driver");
      for (size_t a = 0; a < sizes->size(); ++a) {
        patch.values.emplace_back((*sizes)[a]);
        if ((*sizes)[a] > 0) std::memcpy(patch.values.back().data(), p.kernelParams[a], (*sizes)[a]);
      }
    } else if (p.extra != nullptr) {  // one buffer: {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END}
      const void* buffer = nullptr;
      for (size_t i = 0; p.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = p.extra[i + 1];
        if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) patch.extra_size = *static_cast<const size_t*>(p.extra[i + 1]);
      }
      if (buffer == nullptr) return std::string("a kernel launched with an argument list this cannot read");
      patch.values.emplace_back(patch.extra_size);
      if (patch.extra_size > 0) std::memcpy(patch.values.back().data(), buffer, patch.extra_size);
    }
    for (size_t a = 0; a < patch.values.size(); ++a) {
      const std::vector<uint8_t>& bytes = patch.values[a];
      for (size_t at = 0; at + sizeof(uint64_t) <= bytes.size(); at += sizeof(uint64_t)) {
        uint64_t word = 0;
        std::memcpy(&word, bytes.data() + at, sizeof(word));
        std::optional<size_t> owner;
        for (size_t i = 0; i < ranges.size(); ++i) {
          if (word < ranges[i].start || word >= ranges[i].end) continue;
          if (owner) return std::string("a kernel argument lies inside two written inputs");
          owner = i;
        }
        if (owner) {
          patch.words.push_back(
              {a, at, *owner, static_cast<intptr_t>(word) - static_cast<intptr_t>(ranges[*owner].start)});
        }
      }
    }
    if (!patch.words.empty()) out.patches_.push_back(std::move(patch));
  }
  // kernelParams (or extra) point into each patch's own bytes, set once the list no longer moves
  for (Patch& patch : out.patches_) {
    for (auto& bytes : patch.values) patch.pointers.push_back(bytes.data());
    if (patch.params.kernelParams != nullptr) {
      patch.params.kernelParams = patch.pointers.data();
    } else {
      patch.extra = {CU_LAUNCH_PARAM_BUFFER_POINTER, patch.values[0].data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &patch.extra_size, CU_LAUNCH_PARAM_END};
      patch.params.extra = patch.extra.data();
    }
  }
  return std::nullopt;
}

void Repointer::apply(const std::vector<uintptr_t>& data) {
  TORCH_CHECK(data.size() == current_.size(), "opgen CUDA graph: repointing ", current_.size(), " inputs, given ",
              data.size());
  for (Patch& patch : patches_) {
    bool moved = false;
    for (const Word& w : patch.words) moved |= data[w.input] != current_[w.input];
    if (!moved) continue;
    for (const Word& w : patch.words) {
      const uint64_t word = static_cast<uint64_t>(static_cast<intptr_t>(data[w.input]) + w.delta);
      std::memcpy(patch.values[w.param].data() + w.offset, &word, sizeof(word));
    }
    const CUresult r = driver().setParams(patch.node, &patch.params);
    TORCH_CHECK(r == CUDA_SUCCESS, "opgen CUDA graph: repointing a kernel node failed: ", error_text(r));
  }
  current_ = data;
}

}  // namespace opgen
