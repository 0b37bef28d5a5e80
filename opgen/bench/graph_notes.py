"""What the `torch.compile(backend="opgen")` rows of a benchmark compiled, in a line for the table.

Where a generate() row takes longer than transformers' loop plus opgen's step, the first questions are
whether its graphs replayed as CUDA graphs and whether its decode attention became opgen's kernel.
`collecting()` keeps every function the backend compiles while it is open (Dynamo's graphs, in order);
`note()` reads their reports: per graph, the CUDA-graph line's replays and plain calls (or why it runs
plain), and whether it holds the decode-attention kernel.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def collecting() -> Iterator[list[Callable[..., Any]]]:
    """The backend's compiled functions, appended as Dynamo hands it graphs (the list outlives the block)."""
    from opgen.runtime.frontend import dynamo

    made: list[Callable[..., Any]] = []
    compile_graph = dynamo.compile_aten_graph

    def keeping(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        fn = compile_graph(*args, **kwargs)
        made.append(fn)
        return fn

    dynamo.compile_aten_graph = keeping
    try:
        yield made
    finally:
        dynamo.compile_aten_graph = compile_graph


def note(made: list[Callable[..., Any]]) -> str:
    """`graph i: <how it ran>[, decode attention]` for each compiled function, `; `-separated."""
    parts = []
    for i, fn in enumerate(made):
        report = str(fn.report()) if hasattr(fn, "report") else ""
        part = f"graph {i}: {_graph_line(report)}"
        if "decode attention" in report:
            part += ", decode attention"
        parts.append(part)
    return "; ".join(parts)


_SIZES = re.compile(r"(\d+) captured .*?\((\d+) replays(?:; calls that ran plain: ([^)]*))?\)")


def _graph_line(report: str) -> str:
    line = next((s.strip() for s in report.splitlines() if s.strip().startswith("CUDA graph:")), "")
    if not line:
        return "plain"
    if (sizes := _SIZES.search(line)) is not None:  # a dynamic graph's captures (execution.size_graphs)
        return f"{sizes[1]} sizes captured, {sizes[2]} replays" + (f", plain: {sizes[3]}" if sizes[3] else "")
    if (replayed := re.search(r"\((\d+) replays(?:; (\d+) calls ran plain)?", line)) is not None:
        text = f"{replayed.group(1)} replays, {replayed.group(2) or 0} plain"
        if (graphs := re.search(r"captured \((\d+) graphs.*in place at (\d+) set", line)) is not None:
            text += f" ({graphs[1]} graphs: written inputs in place at {graphs[2]} sets of addresses)"
            if (refused := re.search(r"; not repointed: ([^;]*)", line)) is not None:
                text += f", not repointed: {refused[1]}"
        elif (moved := re.search(r"repointed at new addresses (\d+) times", line)) is not None:
            text += f" (written inputs repointed {moved[1]} times)"
        return text
    return line.removeprefix("CUDA graph: ")[:80]
