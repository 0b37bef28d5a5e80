// GraphRunner: replays a captured CUDA graph for opgen's CUDA-graph mode (opgen.runtime.execution.cuda_graphs).
// Compiled only into CUDA builds (OPGEN_WITH_CUDA).
#pragma once

#include <pybind11/pybind11.h>

namespace opgen {

// Adds `GraphRunner` and `StreamFence` to `m`.
//
// A runner owns an executable graph built around the captured body: one memcpy node per input
// (caller's tensor -> static input buffer) before it, one memcpy node per fresh output (static
// output -> a newly allocated tensor) and one per mutated input (static buffer -> caller's tensor)
// after it. A call checks the inputs (as InputCheck does; NotImplemented when they do not fit),
// points the memcpy nodes at this call's tensors (disabling those whose tensor already is the
// static buffer), and launches the graph on the caller's current stream. The StreamFence shared
// by the runners of one memory pool orders their launches when the caller's stream changes.
//
// A graph with random ops is built inside the torch.cuda.CUDAGraph that captured it (the captured
// body moved into a child node) and launched through at::cuda::CUDAGraph::replay(), which first
// writes the default generator's seed and offset where the random kernels read them and advances
// the offset: each replay draws fresh numbers, as a replay of torch's own graphs does.
void add_cuda_graph(pybind11::module_& m);

}  // namespace opgen
