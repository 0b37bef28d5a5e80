"""CUDA-graph mode: each specialization of a compiled function is captured once, then replayed from C++.

What is captured is the plain generated function (`executor.bind`). The function handed out is an
`opgen._C.GraphRunner`, a C++ callable. Its first call with inputs it was compiled for runs the plain
function and returns that result; then the function is warmed up once on a side stream, captured
into a CUDA graph from the memory pool all graphs of the compiled model share (cuBLAS's workspace
drawn from that pool too, `owned_workspaces`, so nothing else in the process can free it), and the
runner is armed with it. From the second call on, the runner checks the inputs in C++ (inputs it was not
captured for go to the plain function and its slow path), copies them into the static input
buffers (copy nodes of the graph itself, switched off for a tensor that already is its static
buffer: `compiled.static_inputs`), launches the graph on the caller's current stream and returns
the outputs. Inputs the graph writes are copied back. A fresh output the caller has dropped (no
reference, no view) backs the next call's output instead of a new allocation.

Outputs: by default fresh tensors the caller owns (one more copy node per output). With
`static_outputs=True` the graph's own output buffers are returned: no copy, but the next call
overwrites them, so a caller keeping a result across calls must clone it. Outputs that are inputs
or views of inputs are views of the caller's tensors, as in plain mode; constants are returned as
they are.

Random ops (`rand`, `randn`, dropout in training, `bernoulli`, ...) are captured too, and each replay
draws fresh numbers, as torch's own graphs do: the captured kernels read the philox seed and offset of
the device's default generator from device memory, and torch's `CUDAGraph.replay()` writes the
generator's current seed and offset there before it launches, then advances the offset by what the
graph consumes. For such a graph the runner launches through torch's `replay()` (its body is moved
inside torch's graph, with the copy nodes around it), so `torch.manual_seed` before a call makes
the numbers reproducible, and a graph draws the numbers plain calls would have drawn: the warm-up's
draws are undone. Which calls draw random numbers is decided at compile time from their arguments
(`CompiledGraph.random_calls`): attention at dropout_p=0 (every eval transformer) draws none, and
replays with a plain launch. (Ops on another generator cannot reach a compiled graph: export and
torch.compile do not pass generator objects to it.)

A graph compiled for dynamic shapes gets a capture for each set of sizes it is called at
(`execution.size_graphs`, which wraps every graph: static ones here). Under torch.compile the inputs
a graph writes are used in place, the runner repointing the graph at each call's tensors; where it
cannot, they are copied, with in-place captures for addresses that come back
(`execution.address_graphs`, through `CudaGraphs.captured`). The plain function runs
instead, with one warning and a line in `report()`, where a replay could not be faithful: no CUDA
tensor, several devices, outputs that share memory in a way copies cannot reproduce, or a failed
capture (an op that synchronizes with the host, a CPU tensor copied in).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.errors import CaptureRefused, warn
from opgen.runtime.execution.address_graphs import AddressGraphs
from opgen.runtime.execution.graph_outputs import output_plans, pool_ranges
from opgen.runtime.execution.guards import fast_check

Compiled = Callable[..., Any]

__all__ = ["CaptureRefused", "Compiled", "CudaGraphs", "GraphOptions", "GraphStatus", "Pool"]


@dataclass(frozen=True, slots=True)
class GraphOptions:
    static_outputs: bool = False  # return the graph's own output buffers (overwritten by the next call)
    warmup: int = 1  # plain runs on the capture stream before capturing (lazy initialisation)


@dataclass
class GraphStatus:
    """How one specialization runs: replayed from a captured graph, or plain (and why)."""

    captured: bool = False
    reason: str | None = None  # why it runs plain
    capture_seconds: float = 0.0
    random: tuple[str, ...] = ()  # the ATen ops that draw random numbers (fresh on every replay)
    calls: Callable[[], tuple[int, int]] | None = None  # (replays, calls that ran plain after the capture)
    # A capture asked to repoint its written inputs (`execution.address_graphs`): whether it could (None: not
    # asked, or not captured yet), why not, how many kernels take their addresses, and how often it moved.
    repointed: bool | None = None
    not_repointed: str | None = None
    repointed_kernels: int = 0
    repoints: Callable[[], int] = lambda: 0

    def line(self, inputs: str = "") -> str:
        """`report()`'s line; `inputs`: what the capture does with its inputs, said after the replays."""
        if self.captured:
            line = f"CUDA graph: captured on the first call ({self.capture_seconds:.2f} s), replayed since"
            if self.calls is not None:
                replays, plain = self.calls()
                line += f" ({replays} replays" + (
                    f"; {plain} calls ran plain: inputs unlike the capture's (sizes, strides, or another tensor "
                    "for a fixed input)" if plain else "") + ")"  # fmt: skip
            if inputs:
                line += f"; {inputs}"
            if self.random:
                line += f"; random ops ({', '.join(self.random)}) draw fresh numbers on every replay"
            return line
        if self.reason is not None:
            return f"CUDA graph: not used, running the plain generated code: {self.reason}"
        return "CUDA graph: not captured yet (the first call with fitting inputs captures it)"


@dataclass
class Pool:
    """The memory pool, capture stream and stream fence the graphs of one model share on a device."""

    device: torch.device
    handle: Any = field(init=False)
    stream: torch.cuda.Stream = field(init=False)
    fence: Any = field(init=False)

    def __post_init__(self) -> None:
        from opgen._C import StreamFence

        self.handle = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(self.device)
        self.fence = StreamFence()


class CudaGraphs:
    """The CUDA-graph mode of one compiled model: its options, pools, and the one warning it gives."""

    def __init__(self, options: GraphOptions, model: str) -> None:
        self.options = options
        self.model = model
        self.pools: dict[torch.device, Pool] = {}
        self.warned = False

    def wrap(
        self,
        plain: Compiled,
        graph: CompiledGraph,
        constants: Mapping[str, torch.Tensor],
        fixed: Sequence[int] = (),
        rebound: Sequence[int] = (),
    ) -> Compiled:
        """The function to hand out for a static graph: captures on its first fitting call, then replays
        (a dynamic graph: `execution.size_graphs.wrap`).

        `fixed` are inputs always passed at one address (parameters under torch.compile): they are
        not copied, and a call passing another tensor for one of them runs the plain function.
        `rebound` are inputs the graph writes: used in place wherever they live (the graph repointed at
        them), else copied in and out at new addresses and used in place where their addresses come back
        (`execution.address_graphs`).
        """
        if graph.dynamic:
            raise TypeError("CudaGraphs.wrap takes a static graph; execution.size_graphs.wrap takes any")
        device = self.placed(plain, graph, constants)
        if device is None:
            return plain
        return self.captured(plain, graph, constants, self.pool(device), fixed, rebound)

    def captured(
        self, plain: Compiled, graph: CompiledGraph, constants: Mapping[str, torch.Tensor], pool: Pool,
        fixed: Sequence[int], rebound: Sequence[int],
    ) -> Compiled:  # fmt: skip
        """A static graph's runner on `pool` (a `Capture`'s); with `rebound` inputs, an `AddressGraphs` choosing
        among a capture repointed at them, captures that use them in place and one that copies them."""

        def capture(used_in_place: Sequence[int], repoint: Sequence[int] = ()) -> Compiled:
            status = GraphStatus(random=random_ops(graph))
            return Capture(self, plain, graph, constants, pool, frozenset(used_in_place), status,
                           frozenset(repoint)).forward()  # fmt: skip

        if not rebound:
            return capture(fixed)
        return AddressGraphs(lambda repoint: capture([*fixed, *rebound], rebound if repoint else ()),
                             lambda: capture(fixed), plain, rebound, random_ops(graph))  # fmt: skip

    def placed(
        self, plain: Compiled, graph: CompiledGraph, constants: Mapping[str, torch.Tensor]
    ) -> torch.device | None:
        """The device to capture `graph` on; None where it cannot be captured (`plain.graph_status` says why)."""
        try:
            return graph_device(graph, constants)
        except CaptureRefused as exc:
            status = GraphStatus(random=random_ops(graph))
            self.refuse(status, str(exc))
            plain.graph_status = status  # type: ignore[attr-defined]
            return None

    def pool(self, device: torch.device) -> Pool:
        if device not in self.pools:
            self.pools[device] = Pool(device)
        return self.pools[device]

    def refuse(self, status: GraphStatus, reason: str) -> None:
        """Record why `status`'s graph runs plain; warn (pointing at the caller's line) once per model."""
        status.reason = reason
        if not self.warned:
            self.warned = True
            warn(
                f"opgen: CUDA graphs not used for {self.model}: {reason}; it runs as plain generated code "
                "(compile with cuda_graphs=False to say so and silence this)"
            )


def graph_device(graph: CompiledGraph, constants: Mapping[str, torch.Tensor]) -> torch.device:
    """The one CUDA device the graph runs on; refused where an input lives on the CPU."""
    tensors = [spec for spec in graph.inputs if not spec.size]
    devices = {torch.device(spec.device) for spec in tensors}
    host = [spec.name for spec in tensors if torch.device(spec.device).type == "cpu"]
    if host and any(d.type == "cuda" for d in devices):
        raise CaptureRefused(f"input {host[0]} is a CPU tensor: a graph replays the value it read at capture, "
                             "not the caller's (pass it on the GPU)")  # fmt: skip
    devices |= {constants[key].device for _, key in graph.constants if key in constants}
    cuda = sorted({d for d in devices if d.type == "cuda"}, key=str)
    if not cuda:
        raise CaptureRefused("the graph has no CUDA tensors (it runs on the CPU)")
    if len(cuda) > 1:
        raise CaptureRefused(f"the graph spans several devices ({', '.join(map(str, cuda))})")
    return cuda[0] if cuda[0].index is not None else torch.device("cuda", torch.cuda.current_device())


def random_ops(graph: CompiledGraph) -> tuple[str, ...]:
    """The ATen ops of the graph's calls that draw random numbers, sorted, each once."""
    return tuple(sorted({target for _, target in graph.random_calls}))


@dataclass
class Capture:
    """The first call of one specialization: run it plain, capture it, arm the runner the caller holds."""

    graphs: CudaGraphs
    plain: Compiled
    graph: CompiledGraph
    constants: Mapping[str, torch.Tensor]
    pool: Pool
    fixed: frozenset[int]
    status: GraphStatus
    repoint: frozenset[int] = frozenset()  # inputs used in place (in `fixed`) the runner follows to new addresses
    runner: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # one capture, even from several threads

    def forward(self) -> Compiled:
        """The function handed out: the C++ runner, which calls `first_call` until it holds a graph."""
        from opgen._C import GraphRunner

        self.runner = runner = GraphRunner(self.first_call)
        self.runner.graph_status = self.status
        self.status.calls = lambda: (runner.replays, runner.plain_calls)
        self.runner.static_inputs = ()
        return self.runner  # type: ignore[no-any-return]

    def first_call(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:  # by keyword: run plain (the runner replays positional calls only)
            return self.plain(*args, **kwargs)
        result = self.plain(*args)  # checks the inputs; others go to their own specialization
        if not fast_check(self.graph.inputs)(*args):
            return result
        with self.lock:
            if self.runner.fallback is not self.plain:  # not captured (or refused) by another thread meanwhile
                self.runner.fallback = self.plain  # from now on, inputs that do not fit run plain
                self.capture_or_refuse(args)
        return result

    def capture_or_refuse(self, args: tuple[Any, ...]) -> None:
        start = time.perf_counter()
        try:
            self.capture(args)
        except CaptureRefused as exc:
            self.graphs.refuse(self.status, str(exc))
        except Exception as exc:  # a capture that fails for any reason: never the caller's problem
            torch.cuda.synchronize(self.pool.device)
            reason = f"capture failed: {type(exc).__name__}: {error_summary(exc)}"
            self.graphs.refuse(self.status, reason)
        else:
            self.status.captured = True
            self.status.capture_seconds = time.perf_counter() - start

    def capture(self, args: tuple[Any, ...]) -> None:
        from opgen._C import arm_graph_runner

        statics = [
            a if i in self.fixed else torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            for i, a in enumerate(args)
        ]
        caller = torch.cuda.current_stream(self.pool.device)
        written = [self.constants[key] for key in self.graph.written_constants]
        # Module buffers torch.compile passes at a fixed address are written in place by the warm-up too.
        written += [a for i, a in enumerate(args) if i in self.fixed and i in self.graph.written_inputs]
        generator = torch.cuda.default_generators[self.pool.device.index]
        with torch.cuda.device(self.pool.device):
            self.pool.stream.wait_stream(caller)
            with torch.cuda.stream(self.pool.stream):
                saved = [t.clone() for t in written]  # warm-up runs must not advance buffers,
                rng = generator.get_state()  # nor the random number generator
                for static, arg in zip(statics, args, strict=True):
                    if static is not arg:
                        static.copy_(arg)
                for _ in range(self.graphs.options.warmup):
                    self.plain(*statics)
                for t, value in zip(written, saved, strict=True):
                    t.copy_(value)
                generator.set_state(rng)
            cuda_graph = torch.cuda.CUDAGraph(keep_graph=True)
            with owned_workspaces(), torch.cuda.graph(cuda_graph, pool=self.pool.handle, stream=self.pool.stream,
                                                      capture_error_mode="thread_local"):  # fmt: skip
                out = self.plain(*statics)
            caller.wait_stream(self.pool.stream)
        single = isinstance(out, torch.Tensor)
        leaves, spec = pytree.tree_flatten(out)
        plans = output_plans(
            leaves, statics, self.fixed, pool_ranges(self.pool.handle), self.graphs.options.static_outputs
        )
        inputs = [
            ((a.dtype, a.device, tuple(a.shape), a.stride()), s, i in self.fixed, i in self.graph.written_inputs,
             i in self.repoint)
            for i, (a, s) in enumerate(zip(args, statics, strict=True))
        ]  # fmt: skip
        # The graph keeps its own buffers alive, not the caller's tensors it uses in place: a replay needs one
        # at the same address (the runner checks), so one freed and allocated again there replays too.
        owned = tuple(s for i, s in enumerate(statics) if i not in self.fixed)
        if not single and not (type(out) is tuple and all(isinstance(x, torch.Tensor) for x in out)):
            self.runner.rebuild = lambda flat: pytree.tree_unflatten(list(flat), spec)
        refused, kernels = arm_graph_runner(
            self.runner, cuda_graph.raw_cuda_graph(), inputs, plans, single, self.pool.device.index, self.pool.fence,
            list(args), (cuda_graph, owned, leaves), cuda_graph if self.status.random else None,
        )  # fmt: skip
        self.runner.static_inputs = owned
        if self.repoint:
            runner = self.runner
            self.status.repointed, self.status.not_repointed = refused is None, refused
            self.status.repointed_kernels, self.status.repoints = kernels, lambda: runner.repoints


def error_summary(exc: BaseException, limit: int = 400) -> str:
    """An exception's message on one line: its lines up to C++'s backtrace, joined, at most `limit` characters."""
    lines = []
    for line in str(exc).strip().splitlines():
        if line.startswith("Exception raised from"):
            break
        if line.strip():
            lines.append(line.strip())
    text = " ".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def owned_workspaces() -> Iterator[None]:
    """Around a capture: the cuBLAS/cuBLASLt workspaces its kernels use are drawn from the graph's pool.

    ATen keeps one workspace per (cuBLAS handle, stream) in a map the whole process shares, and a
    captured GEMM records its address. Anyone may empty that map (`torch._C._cuda_clearCublasWorkspaces`,
    which Inductor's cudagraph trees call around every warm-up and capture) and free the memory, so a
    workspace from the general cache would be lost under the graph. Emptied before the capture, the
    map gets the capture's workspace allocated inside the capture, from the graph's private pool;
    emptied after it, the map forgets that block, which goes back to the pool: no allocation outside
    a capture into this pool can get it, and `empty_cache` keeps the pool's memory while a graph of
    it lives. Whatever the process clears or frees later, the graph's workspace stays reserved. The
    same as torch's cudagraph trees do (`clear_cublas_manager`); other streams' workspaces are simply
    allocated again at their next GEMM.
    """
    torch._C._cuda_clearCublasWorkspaces()
    try:
        yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()
