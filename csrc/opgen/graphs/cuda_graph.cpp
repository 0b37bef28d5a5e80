#include "opgen/graphs/cuda_graph.h"

#include "opgen/graphs/repoint.h"

#include "opgen/py/input_check.h"
#include "opgen/py/object_fields.h"
#include "opgen/py/py_refs.h"
#include "opgen/py/vectorcall_type.h"

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <structmember.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

// A failed CUDA runtime call becomes a RuntimeError naming the call and CUDA's message.
#define OPGEN_CUDA_CHECK(expr)                                                                  \
  do {                                                                                          \
    const cudaError_t opgen_err = (expr);                                                       \
    if (opgen_err != cudaSuccess) {                                                             \
      (void)cudaGetLastError();                                                                 \
      TORCH_CHECK(false, "opgen CUDA graph: ", #expr, " failed: ", cudaGetErrorString(opgen_err)); \
    }                                                                                           \
  } while (0)

namespace opgen {
namespace {

// Bytes a strided tensor reaches from its first element (strides are never negative in torch).
size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<size_t>(last + 1) * t.element_size();
}

// Orders launches that share a memory pool when the caller's stream changes: the work so far on
// the old stream is recorded as an event the new stream waits for. Free while the stream stays.
struct StreamFence {
  cudaStream_t last = nullptr;
  cudaEvent_t event = nullptr;

  void enter(cudaStream_t stream) {
    if (stream == last) return;
    if (last != nullptr) {
      if (event == nullptr) OPGEN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      OPGEN_CUDA_CHECK(cudaEventRecord(event, last));
      OPGEN_CUDA_CHECK(cudaStreamWaitEvent(stream, event, 0));
    }
    last = stream;
  }

  ~StreamFence() {
    if (event != nullptr) cudaEventDestroy(event);  // no throw from a destructor
  }
};

// A memcpy node whose source or destination is repointed per call, and which can be switched off.
struct CopyNode {
  cudaGraphNode_t node = nullptr;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  bool enabled = true;

  void set(cudaGraphExec_t exec, void* new_dst, const void* new_src) {
    const bool want = new_dst != new_src;  // the tensor already is the static buffer: nothing to copy
    if (want != enabled) {
      OPGEN_CUDA_CHECK(cudaGraphNodeSetEnabled(exec, node, want ? 1 : 0));
      enabled = want;
    }
    if (want && (new_dst != dst || new_src != src)) {
      const cudaError_t err =
          cudaGraphExecMemcpyNodeSetParams1D(exec, node, new_dst, new_src, bytes, cudaMemcpyDeviceToDevice);
      TORCH_CHECK(err == cudaSuccess, "opgen CUDA graph: repointing a copy node (", dst, " <- ", src, ") to (",
                  new_dst, " <- ", new_src, ", ", bytes, " bytes) failed: ", cudaGetErrorString(err));
      dst = new_dst;
      src = new_src;
    }
  }
};

struct Input {
  ExpectedTensor expected;
  void* static_ptr = nullptr;
  bool fixed = false;    // must be passed at the static address (a parameter): no copy node
  bool written = false;  // the graph writes it: copied back to the caller's tensor afterwards
  bool repoint = false;  // used in place wherever it lives: the kernels' arguments follow its address (repoint.h)
  CopyNode copy_in;      // caller -> static (node == nullptr: none)
  CopyNode write_back;   // static -> caller (node == nullptr: none)
};

enum class OutputKind { Fresh, FreshView, InputView, Object };

struct Output {
  OutputKind kind = OutputKind::Object;
  int64_t index = 0;  // FreshView: the Fresh output it views; InputView: the input
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;  // views: element offset from the viewed tensor's first element
  at::Tensor static_tensor;  // Fresh: the graph's output buffer
  CopyNode copy_out;         // Fresh: static -> new tensor
  PyObject* last = nullptr;  // Fresh: the tensor object the last call returned (a reference of ours)

  // The last result again, if nothing but this runner can reach it: no other reference to the
  // Python object, no weak reference, no other tensor on its storage (a view), no grad.
  PyObject* reusable() const {
    if (last == nullptr || !only_opgen_reaches(last)) return nullptr;
    return THPVariable_Unpack(last).requires_grad() ? nullptr : last;
  }

  py::object object;         // Object: returned as it is
};

// The callable itself. Until it is armed with a captured graph, and for inputs the graph was not
// captured for, it calls `fallback` (the plain generated function, or the first call's capture).
// `rebuild`, if set, turns the flat tuple of outputs into the caller's structure.
struct GraphRunner {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  struct State* state;  // null until armed
  PyObject* fallback;
  PyObject* rebuild;
  PyObject* dict;  // attributes (report, artifact, ...)
  unsigned long long replays;      // calls replayed from the graph
  unsigned long long plain_calls;  // calls after the capture whose inputs did not fit it (run by the fallback)
  unsigned long long repoints;     // replays that first pointed the graph at another address of an input

  // The Python objects it holds, for the cyclic GC (object_fields.h).
  template <typename F>
  void for_each_object(F&& f) {
    f(fallback);
    f(rebuild);
    f(dict);
  }
};

struct State {
  cudaGraph_t graph = nullptr;  // kept: the copy nodes' handles belong to it
  cudaGraphExec_t exec = nullptr;
  // Graphs with random ops: torch's graph, which holds `exec` (and the graph the copy nodes belong
  // to) and launches it through its replay(), which first points the random kernels at the
  // generator's current seed and offset and advances the offset (see build_in_torch_graph).
  at::cuda::CUDAGraph* torch_graph = nullptr;
  c10::DeviceIndex device = 0;
  bool single = false;
  std::vector<Input> inputs;
  std::vector<Output> outputs;
  std::shared_ptr<StreamFence> fence;
  py::object keep_alive;  // the captured graph (and its pool), static buffers
  // Repointed inputs: the captured body's node in the runner's graph (the graph it holds is the one whose
  // kernel nodes the repointer rewrites), the repointer, and which inputs it follows.
  cudaGraphNode_t body_node = nullptr;
  Repointer repointer;
  std::vector<size_t> repointed;

  ~State() {
    for (Output& out : outputs) Py_CLEAR(out.last);
    if (torch_graph == nullptr && exec != nullptr) cudaGraphExecDestroy(exec);  // else torch's to destroy
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

// One call: check, repoint the copies, launch, build the results. The GIL is held throughout, so
// calls of one runner never interleave.
bool fits(const State& s, PyObject* const* args, Py_ssize_t n, PyObject* kwnames) {
  if (kwnames != nullptr || n != static_cast<Py_ssize_t>(s.inputs.size())) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Input& in = s.inputs[i];
    if (!matches(args[i], in.expected)) return false;
    if (in.fixed && !in.repoint && THPVariable_Unpack(args[i]).data_ptr() != in.static_ptr) return false;
  }
  return true;
}

PyObject* replay(State& s, PyObject* const* args, Py_ssize_t n);
bool repoint(State& s, PyObject* const* args);

PyObject* run(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* runner = reinterpret_cast<GraphRunner*>(self);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (runner->state == nullptr || !fits(*runner->state, args, n, kwnames)) {
    if (runner->state != nullptr) ++runner->plain_calls;
    if (runner->fallback == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, "opgen GraphRunner: no fallback function set");
      return nullptr;
    }
    return PyObject_Vectorcall(runner->fallback, args, nargsf, kwnames);
  }
  ++runner->replays;
  if (!runner->state->repointed.empty()) {
    try {
      runner->repoints += repoint(*runner->state, args) ? 1 : 0;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return nullptr;
    }
  }
  PyObject* out = replay(*runner->state, args, n);
  if (out == nullptr || runner->rebuild == nullptr) return out;
  PyObject* rebuilt = PyObject_CallOneArg(runner->rebuild, out);
  Py_DECREF(out);
  return rebuilt;
}

// Points the graph at this call's repointed inputs where any moved; true if it did.
bool repoint(State& s, PyObject* const* args) {
  bool moved = false;
  std::vector<uintptr_t> now(s.repointed.size());
  for (size_t k = 0; k < s.repointed.size(); ++k) {
    now[k] = reinterpret_cast<uintptr_t>(THPVariable_Unpack(args[s.repointed[k]]).data_ptr());
    moved |= now[k] != s.repointer.addresses()[k];
  }
  if (!moved) return false;
  cudaGraph_t body = nullptr;
  OPGEN_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(s.body_node, &body));
  s.repointer.apply(now);
  OPGEN_CUDA_CHECK(cudaGraphExecChildGraphNodeSetParams(s.exec, s.body_node, body));
  return true;
}

PyObject* replay(State& s, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  c10::cuda::CUDAGuard guard(s.device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(s.device).stream();
  s.fence->enter(stream);
  for (Py_ssize_t i = 0; i < n; ++i) {
    Input& in = s.inputs[i];
    void* ptr = THPVariable_Unpack(args[i]).data_ptr();
    if (in.copy_in.node != nullptr) in.copy_in.set(s.exec, in.static_ptr, ptr);
    if (in.write_back.node != nullptr) in.write_back.set(s.exec, ptr, in.static_ptr);
  }
  std::vector<at::Tensor> fresh(s.outputs.size());
  std::vector<PyObject*> reused(s.outputs.size(), nullptr);
  for (size_t i = 0; i < s.outputs.size(); ++i) {
    Output& out = s.outputs[i];
    if (out.kind != OutputKind::Fresh) continue;
    const at::Tensor& st = out.static_tensor;
    reused[i] = out.reusable();
    fresh[i] = reused[i] != nullptr ? THPVariable_Unpack(reused[i])
                                    : at::Tensor(at::detail::empty_strided_cuda(st.sizes(), st.strides(),
                                                                                st.scalar_type(), st.device()));
    if (out.copy_out.node != nullptr) out.copy_out.set(s.exec, fresh[i].data_ptr(), out.static_tensor.data_ptr());
  }
  if (s.torch_graph != nullptr) {
    s.torch_graph->replay();  // the generator's prologue, then s.exec on this device's current stream
  } else {
    OPGEN_CUDA_CHECK(cudaGraphLaunch(s.exec, stream));
  }

  const size_t count = s.outputs.size();
  PyObject* tuple = s.single ? nullptr : PyTuple_New(static_cast<Py_ssize_t>(count));
  if (!s.single && tuple == nullptr) return nullptr;
  for (size_t i = 0; i < count; ++i) {
    Output& out = s.outputs[i];
    PyObject* item = nullptr;
    switch (out.kind) {
      case OutputKind::Fresh:
        if (reused[i] != nullptr) {
          item = Py_NewRef(reused[i]);
        } else {
          item = wrap(fresh[i]);
          Py_XSETREF(out.last, Py_XNewRef(item));
        }
        break;
      case OutputKind::FreshView: {
        const at::Tensor& base = fresh[out.index];
        item = wrap(base.as_strided(out.sizes, out.strides, base.storage_offset() + out.offset));
        break;
      }
      case OutputKind::InputView: {
        const at::Tensor& base = THPVariable_Unpack(args[out.index]);
        item = wrap(base.as_strided(out.sizes, out.strides, base.storage_offset() + out.offset));
        break;
      }
      case OutputKind::Object:
        item = out.object.inc_ref().ptr();
        break;
    }
    if (item == nullptr) {
      Py_XDECREF(tuple);
      return nullptr;
    }
    if (s.single) return item;
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
  }
  return tuple;
  END_HANDLE_TH_ERRORS
}

void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  clear_objects<GraphRunner>(self);
  delete reinterpret_cast<GraphRunner*>(self)->state;
  Py_TYPE(self)->tp_free(self);
}

PyMemberDef members[] = {
    {"fallback", T_OBJECT, offsetof(GraphRunner, fallback), 0, "called where no replay fits"},
    {"rebuild", T_OBJECT, offsetof(GraphRunner, rebuild), 0, "flat outputs -> the caller's structure"},
    {"replays", T_ULONGLONG, offsetof(GraphRunner, replays), READONLY, "calls replayed from the captured graph"},
    {"plain_calls", T_ULONGLONG, offsetof(GraphRunner, plain_calls), READONLY,
     "calls after the capture whose inputs did not fit it (sizes, strides, a fixed input's address): run plain"},
    {"repoints", T_ULONGLONG, offsetof(GraphRunner, repoints), READONLY,
     "replays that first pointed the graph at new addresses of the inputs it uses in place wherever they live"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef getset[] = {{"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
                        {nullptr, nullptr, nullptr, nullptr, nullptr}};


PyTypeObject* runner_type() {
  static PyTypeObject type = vectorcall_type<GraphRunner>(
      "opgen._C.GraphRunner",
      "A compiled function in CUDA-graph mode: replays its captured graph, else calls its fallback.",
      {dealloc, traverse_objects<GraphRunner>, clear_objects<GraphRunner>, members, getset,
       offsetof(GraphRunner, dict), 0, copied_as_itself()});
  return &type;
}

cudaGraphNode_t add_copy(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& deps, CopyNode& copy,
                         void* dst, const void* src, size_t bytes) {
  copy.dst = dst;
  copy.src = src;
  copy.bytes = bytes;
  OPGEN_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&copy.node, graph, deps.data(), deps.size(), dst, src, bytes,
                                          cudaMemcpyDeviceToDevice));
  return copy.node;
}

// Adds to the empty graph `outer` the captured body, as a child graph node, and the copy nodes
// around it. `first` are the tensors of the call that captured it: the copy nodes start out
// pointing at them, and at `placeholders` (the caller keeps them until it has instantiated).
void wire(State& s, cudaGraph_t outer, cudaGraph_t body, const std::vector<at::Tensor>& first,
          std::vector<at::Tensor>& placeholders) {
  std::vector<cudaGraphNode_t> before;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    Input& in = s.inputs[i];
    const size_t bytes = span_bytes(first[i]);
    if (in.fixed || bytes == 0) continue;
    TORCH_CHECK(first[i].data_ptr() != in.static_ptr, "GraphRunner: a first input is its own static buffer");
    before.push_back(add_copy(outer, {}, in.copy_in, in.static_ptr, first[i].data_ptr(), bytes));
  }
  cudaGraphNode_t body_node = nullptr;
  OPGEN_CUDA_CHECK(cudaGraphAddChildGraphNode(&body_node, outer, before.data(), before.size(), body));
  s.body_node = body_node;
  const std::vector<cudaGraphNode_t> after{body_node};
  for (Output& out : s.outputs) {
    if (out.kind != OutputKind::Fresh) continue;
    const at::Tensor& st = out.static_tensor;
    const size_t bytes = span_bytes(st);
    if (bytes == 0) continue;
    placeholders.push_back(
        at::Tensor(at::detail::empty_strided_cuda(st.sizes(), st.strides(), st.scalar_type(), st.device())));
    add_copy(outer, after, out.copy_out, placeholders.back().data_ptr(), st.data_ptr(), bytes);
  }
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    Input& in = s.inputs[i];
    const size_t bytes = span_bytes(first[i]);
    if (in.written && !in.fixed && bytes > 0) {
      add_copy(outer, after, in.write_back, first[i].data_ptr(), in.static_ptr, bytes);
    }
  }
}

// The runner's own graph around the captured body, launched with cudaGraphLaunch.
void build(State& s, cudaGraph_t body, const std::vector<at::Tensor>& first) {
  OPGEN_CUDA_CHECK(cudaGraphCreate(&s.graph, 0));
  std::vector<at::Tensor> placeholders;  // first destinations of the output copies
  wire(s, s.graph, body, first, placeholders);
  OPGEN_CUDA_CHECK(cudaGraphInstantiate(&s.exec, s.graph, 0));
}

struct OwnedGraph {
  cudaGraph_t graph = nullptr;
  ~OwnedGraph() {
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

// A graph with random ops: torch's own graph becomes the runner's graph. Its captured body moves
// into a child node with the copy nodes around it, torch instantiates it, and the runner launches
// it through torch's replay(), which does for the random kernels what a replay of torch's graphs
// does (cudaGraphLaunch alone would replay the same random numbers every call).
void build_in_torch_graph(State& s, at::cuda::CUDAGraph& torch_graph, const std::vector<at::Tensor>& first) {
  cudaGraph_t graph = torch_graph.raw_cuda_graph();
  OwnedGraph body;
  OPGEN_CUDA_CHECK(cudaGraphClone(&body.graph, graph));
  size_t count = 0;
  OPGEN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) OPGEN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  for (size_t i = 0; i < count; ++i) OPGEN_CUDA_CHECK(cudaGraphDestroyNode(nodes[i]));
  std::vector<at::Tensor> placeholders;
  wire(s, graph, body.graph, first, placeholders);
  torch_graph.instantiate();
  s.exec = torch_graph.raw_cuda_graph_exec();
  s.torch_graph = &torch_graph;
}

// Where inputs are to be repointed: finds the kernel arguments holding their addresses in the captured
// body. Returns why not, where it cannot (the inputs then must come at the captured addresses, as fixed).
// An input's bytes are those its elements span: kernels take a tensor's first element's address (and
// offsets from it), so another tensor on the same storage (a weight in one arena with a cache) is not it.
std::optional<std::string> find_repoints(State& s, const std::vector<at::Tensor>& first) {
  std::vector<InputRange> ranges;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    if (!s.inputs[i].repoint) continue;
    const auto data = reinterpret_cast<uintptr_t>(first[i].data_ptr());
    ranges.push_back({data, data + span_bytes(first[i])});
    s.repointed.push_back(i);
  }
  if (s.repointed.empty()) return std::nullopt;
  std::optional<std::string> reason;
  for (size_t i = 0; i < s.inputs.size() && !reason; ++i) {  // one address, one input: else which moves?
    if (!s.inputs[i].fixed) continue;  // copied inputs are read from the graph's own buffers
    const auto data = reinterpret_cast<uintptr_t>(first[i].data_ptr());
    const size_t bytes = span_bytes(first[i]);
    size_t inside = 0;
    for (const InputRange& r : ranges) inside += bytes > 0 && data < r.end && data + bytes > r.start ? 1 : 0;
    if (inside > 1 || (inside == 1 && !s.inputs[i].repoint)) reason = "inputs share memory with a written input";
  }
  cudaGraph_t body = nullptr;
  OPGEN_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(s.body_node, &body));
  if (!reason) reason = Repointer::scan(body, ranges, s.repointer);
  if (reason) {
    for (Input& in : s.inputs) in.repoint = false;
    s.repointed.clear();
  }
  return reason;
}

py::object make_runner(py::object fallback) {
  PyObject* self = PyType_GenericAlloc(runner_type(), 0);
  if (self == nullptr) throw py::error_already_set();
  auto* runner = reinterpret_cast<GraphRunner*>(self);
  runner->vectorcall = run;
  runner->fallback = fallback.release().ptr();
  return py::reinterpret_steal<py::object>(self);
}

// arm(runner, graph, inputs, outputs, single, device, fence, first, keep_alive, random_graph)
//   inputs:  [(spec, static_tensor, fixed, written)]      spec as InputCheck's
//   outputs: [("fresh", static_tensor) | ("fresh_view", i, sizes, strides, offset)
//             | ("input_view", i, sizes, strides, offset) | ("object", obj)]
//   random_graph: None, or the torch.cuda.CUDAGraph that captured `graph` (kept alive by
//             keep_alive) where it has random ops: the runner replays through it
//   an input spec may add a fifth item, `repoint` (used in place, so fixed too): the runner follows
//             the input to each call's address, rewriting the kernel arguments that hold it (repoint.h)
// Returns (None or why the inputs to repoint cannot be: they then must come at the captured address,
//          the number of kernel nodes that take their addresses).
py::object arm(const py::object& target, uintptr_t graph, const py::list& inputs, const py::list& outputs, bool single,
                       int device, std::shared_ptr<StreamFence> fence, const std::vector<at::Tensor>& first,
                       py::object keep_alive, const py::object& random_graph) {
  if (!PyObject_TypeCheck(target.ptr(), runner_type())) throw py::type_error("arm: not a GraphRunner");
  auto* torch_graph = random_graph.is_none() ? nullptr : random_graph.cast<at::cuda::CUDAGraph*>();
  auto state = std::make_unique<State>();
  state->device = static_cast<c10::DeviceIndex>(device);
  state->single = single;
  state->fence = std::move(fence);
  state->keep_alive = std::move(keep_alive);
  if (first.size() != inputs.size()) throw py::value_error("GraphRunner: one first tensor per input");
  for (const py::handle item : inputs) {
    const auto spec = item.cast<py::tuple>();
    Input in{expected_tensor(spec[0])};
    in.static_ptr = spec[1].cast<at::Tensor>().data_ptr();
    in.fixed = spec[2].cast<bool>();
    in.written = spec[3].cast<bool>();
    in.repoint = spec.size() > 4 && spec[4].cast<bool>();
    if (in.repoint && !in.fixed) throw py::value_error("GraphRunner: a repointed input is used in place (fixed)");
    state->inputs.push_back(std::move(in));
  }
  for (const py::handle item : outputs) {
    const auto spec = item.cast<py::tuple>();
    const auto kind = spec[0].cast<std::string>();
    Output out;
    if (kind == "fresh") {
      out.kind = OutputKind::Fresh;
      out.static_tensor = spec[1].cast<at::Tensor>();
    } else if (kind == "fresh_view" || kind == "input_view") {
      out.kind = kind == "fresh_view" ? OutputKind::FreshView : OutputKind::InputView;
      out.index = spec[1].cast<int64_t>();
      out.sizes = spec[2].cast<std::vector<int64_t>>();
      out.strides = spec[3].cast<std::vector<int64_t>>();
      out.offset = spec[4].cast<int64_t>();
    } else if (kind == "object") {
      out.object = py::reinterpret_borrow<py::object>(spec[1]);
    } else {
      throw py::value_error("GraphRunner: unknown output kind '" + kind + "'");
    }
    state->outputs.push_back(std::move(out));
  }
  if (single && state->outputs.size() != 1) throw py::value_error("GraphRunner: single needs one output");
  c10::cuda::CUDAGuard guard(state->device);
  if (torch_graph != nullptr) {
    build_in_torch_graph(*state, *torch_graph, first);
  } else {
    build(*state, reinterpret_cast<cudaGraph_t>(graph), first);
  }
  py::object refused = py::none();
  if (auto reason = find_repoints(*state, first)) refused = py::str(*reason);
  const size_t kernels = state->repointer.nodes();
  auto* runner = reinterpret_cast<GraphRunner*>(target.ptr());
  delete runner->state;
  runner->state = state.release();
  return py::make_tuple(refused, kernels);
}

}  // namespace

void add_cuda_graph(py::module_& m) {
  if (PyType_Ready(runner_type()) != 0) throw py::error_already_set();
  py::class_<StreamFence, std::shared_ptr<StreamFence>>(
      m, "StreamFence", "Orders the launches of graphs sharing one memory pool across caller streams.")
      .def(py::init<>());
  m.def("GraphRunner", &make_runner, py::arg("fallback"),
        "GraphRunner(fallback): a callable that calls `fallback` until arm_graph_runner() gives it a graph.");
  m.def("arm_graph_runner", &arm, py::arg("runner"), py::arg("graph"), py::arg("inputs"), py::arg("outputs"),
        py::arg("single"), py::arg("device"), py::arg("fence"), py::arg("first"), py::arg("keep_alive"),
        py::arg("random_graph"),
        "Gives a GraphRunner its captured graph (see opgen/runtime/execution/cuda_graphs.py).");
}

}  // namespace opgen
