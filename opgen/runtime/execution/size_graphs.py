"""CUDA-graph mode for a graph compiled with dynamic shapes: one capture for each set of sizes it is called at.

A CUDA graph holds fixed sizes, so one capture cannot serve a graph whose sizes are symbols. Such graphs
come from torch.compile's automatic dynamic shapes (a second size seen marks a dimension dynamic:
transformers' generate() called with another prompt length or another `max_new_tokens` makes a new
static cache, of another length, and from then on the decode step's graph is dynamic) and from
`opgen.compile(dynamic_shapes=...)`. Inductor's cudagraph trees record one graph per distinct set of
sizes; so does this. The sizes a call binds (its size inputs, and each size text of its tensors'
specs at its first place) pick a capture, made by the second call at those sizes as a static graph's
is by its first (`cuda_graphs.Capture`, with the specs made concrete and the size inputs bound). The
first call at new sizes runs plain: some graphs take a size that changes on every call (Mistral's
decode step under transformers' generate() takes its mask's length, one longer each token), and a
capture a call would be made and never replayed. Each capture keeps its own static input buffers;
all draw their intermediates from the model's one pool. At most `LIMIT` sets of sizes are captured
per graph; calls at any other sizes run the plain function, counted in `report()`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from opgen.runtime.artifact.compiled import CompiledGraph, InputSpec
from opgen.runtime.execution.cuda_graphs import Compiled, CudaGraphs, Pool, random_ops

LIMIT = 8  # sets of sizes captured per graph (Inductor warns past 8: cudagraph_dynamic_shape_warn_limit)
SEEN = 4096  # sets of sizes called once that are remembered (forgotten all at once past this)

Key = tuple[int, ...]


@dataclass
class SizesStatus:
    """How a dynamic graph runs in CUDA-graph mode: its captures, one a set of sizes, and the calls past them
    (`report()`'s line, as `GraphStatus.line` is a static graph's)."""

    random: tuple[str, ...] = ()  # the ATen ops that draw random numbers (fresh on every replay)
    captures: dict[Key, Any] = field(default_factory=dict)  # GraphStatus (AddressesStatus: the same fields)
    first_calls: int = 0  # first calls at a set of sizes (they ran plain)
    past_limit: int = 0  # calls at sizes beyond the LIMIT captured ones (they ran plain)

    @property
    def captured(self) -> bool:
        """Whether any set of sizes is captured."""
        return any(s.captured for s in self.captures.values())

    def line(self) -> str:
        done = [s for s in self.captures.values() if s.captured]
        refused = next((s.reason for s in self.captures.values() if s.reason is not None), None)
        if not done:
            if refused is not None:
                return f"CUDA graph: not used, running the plain generated code: {refused}"
            return (f"CUDA graph: dynamic shapes; none captured yet (a graph a set of sizes, captured by the second "
                    f"call at them; {self.first_calls} first calls ran plain)")  # fmt: skip
        counts = [s.calls() for s in done if s.calls is not None]
        replays, unfit = sum(r for r, _ in counts), sum(p for _, p in counts)
        seconds = sum(s.capture_seconds for s in done)
        line = (f"CUDA graph: dynamic shapes, one graph a set of sizes: {len(done)} captured ({seconds:.2f} s), "
                f"at most {LIMIT}, replayed since ({replays} replays")  # fmt: skip
        plain = [f"{self.first_calls} first calls at new sizes"] if self.first_calls else []
        plain += [f"{self.past_limit} at sizes past the {LIMIT} captured"] if self.past_limit else []
        plain += [f"{unfit} with inputs unlike a capture's"] if unfit else []
        if plain:
            line += f"; calls that ran plain: {', '.join(plain)}"
        line += ")"
        if refused is not None:
            line += f"; a capture refused: {refused}"
        if self.random:
            line += f"; random ops ({', '.join(self.random)}) draw fresh numbers on every replay"
        return line


def wrap(
    graphs: CudaGraphs, plain: Compiled, graph: CompiledGraph, constants: Mapping[str, torch.Tensor],
    fixed: Sequence[int] = (), rebound: Sequence[int] = (),
) -> Compiled:  # fmt: skip
    """CUDA-graph mode for any graph: a static one captured once (`CudaGraphs.wrap`), a dynamic one once for
    each set of sizes it is called at. `fixed`, `rebound`: as `CudaGraphs.wrap`'s."""
    if not graph.dynamic:
        return graphs.wrap(plain, graph, constants, fixed, rebound)
    device = graphs.placed(plain, graph, constants)
    if device is None:
        return plain
    return SizeGraphs(graphs, plain, graph, constants, graphs.pool(device), frozenset(fixed), frozenset(rebound))


class SizeGraphs:
    """The function handed out for a dynamic graph: a capture per set of sizes, found by a Python dict."""

    def __init__(
        self, graphs: CudaGraphs, plain: Compiled, graph: CompiledGraph, constants: Mapping[str, torch.Tensor],
        pool: Pool, fixed: frozenset[int], rebound: frozenset[int] = frozenset(),
    ) -> None:  # fmt: skip
        self.graphs, self.plain, self.graph, self.constants, self.pool, self.fixed, self.rebound = (
            graphs, plain, graph, constants, pool, fixed, rebound)  # fmt: skip
        self.size_inputs = tuple(i for i, spec in enumerate(graph.inputs) if spec.size)
        self.dims = symbolic_dims(graph.inputs)
        self.runners: dict[Key, Compiled] = {}
        self.seen: set[Key] = set()  # sizes called once, not captured yet
        self.graph_status = SizesStatus(random=random_ops(graph))
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return self.plain(*args, **kwargs)
        try:
            key = tuple(args[i] for i in self.size_inputs) + tuple(args[i].shape[d] for i, d in self.dims)
        except (AttributeError, IndexError, TypeError):  # not the inputs it was compiled for: its errors
            return self.plain(*args)
        runner = self.runners.get(key)
        if runner is None and (runner := self.new_sizes(key, args)) is None:
            return self.plain(*args)
        if not self.size_inputs:
            return runner(*args)
        return runner(*(a for i, a in enumerate(args) if i not in self.size_inputs))

    def new_sizes(self, key: Key, args: Sequence[Any]) -> Compiled | None:
        """The runner for sizes not captured yet: made on their second call; None where the call runs plain
        (their first call, or past LIMIT). Under a lock: threads calling at once capture a set once."""
        with self.lock:
            if (runner := self.runners.get(key)) is not None:
                return runner
            if key not in self.seen:
                if len(self.seen) >= SEEN:
                    self.seen.clear()
                self.seen.add(key)
                self.graph_status.first_calls += 1
                return None
            if len(self.runners) >= LIMIT:
                self.graph_status.past_limit += 1
                return None
            self.seen.discard(key)
            runner = self.runners[key] = self.capture(key, args)
            return runner

    def capture(self, key: Key, args: Sequence[Any]) -> Compiled:
        """The runner for the sizes of `args`: its first call runs plain and captures."""
        tensors = [i for i in range(len(args)) if i not in self.size_inputs]
        values = {i: args[i] for i in self.size_inputs}
        fixed, rebound = ([tensors.index(i) for i in inputs if i in tensors] for inputs in (self.fixed, self.rebound))
        runner = self.graphs.captured(
            bound_sizes(self.plain, values), concrete(self.graph, args, tensors), self.constants, self.pool, fixed,
            rebound,
        )  # fmt: skip
        self.graph_status.captures[key] = runner.graph_status  # type: ignore[attr-defined]
        return runner


def symbolic_dims(specs: Sequence[InputSpec]) -> tuple[tuple[int, int], ...]:
    """(input, dim) of each size text's first place among the tensor inputs' shapes."""
    seen: dict[str, tuple[int, int]] = {}
    for i, spec in enumerate(specs):
        if not spec.size:
            for d, n in enumerate(spec.shape):
                if isinstance(n, str):
                    seen.setdefault(n, (i, d))
    return tuple(seen.values())


def concrete(graph: CompiledGraph, args: Sequence[Any], tensors: Sequence[int]) -> CompiledGraph:
    """`graph` as a static graph of the tensor inputs `tensors`, at the sizes and strides of `args`."""
    specs = tuple(replace(graph.inputs[i], shape=tuple(args[i].shape), stride=tuple(args[i].stride())) for i in tensors)
    written = tuple(tensors.index(i) for i in graph.written_inputs if i in tensors)
    return replace(graph, inputs=specs, written_inputs=written, ranges=())


def bound_sizes(plain: Compiled, values: Mapping[int, int]) -> Compiled:
    """`plain` taking its tensors alone: the size inputs (position -> value) put back in place."""
    if not values:
        return plain
    order = sorted(values.items())

    def call(*tensors: Any) -> Any:
        args = list(tensors)
        for position, value in order:
            args.insert(position, value)
        return plain(*args)

    return call
