"""Cases for tests/runtime/test_distributed_nccl.py, run inside each rank's process (NCCL, one GPU per rank).

Each case takes (rank, world), builds the whole model from one seed in every rank and this rank's
shard of it, runs both on this rank's GPU and returns plain data: the errors of the compiled shard
against the whole model, and which path each all-reduce took (from the compiled function's report).
Every case runs three times: with opgen's default passes (small all-reduces one-shot over peer memory,
through opgen's own kernel, and small all-gathers through opgen's `peer_gather`: route "peer_sum"), with
`peer_sum` and `peer_gather` left out (torch's one-shot kernel, all-gathers on NCCL: "one_shot"), and with
the one-shot passes and `peer_gather` left out (every collective on NCCL: "nccl"). `peer_gather_calls`
calls opgen's all-gather kernel directly, eager and graph-replayed, against NCCL's. `a_peer_never_calls`
(`test_peer_timeout.py`, ranks of their own) leaves rank 0 waiting for a peer that never calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from distributed_cases import Block, ShardedBlock

from opgen.bench import decode_models as dm
from opgen.bench.tp_models import fill_caches, shard

ONE_SHOT_NOTE = "one-shot over peer memory"


def _passes(route: str) -> tuple[str, ...]:
    from opgen.runtime.pipeline import default_pipeline

    left_out = {"peer_sum": (), "one_shot": ("peer_sum", "peer_gather"),
                "nccl": ("peer_sum", "one_shot_all_reduce", "peer_gather")}[route]  # fmt: skip
    return tuple(p for p in default_pipeline() if p not in left_out)


def _routes(fn: Any) -> dict[str, int]:
    """How many all-reduces of a compiled function take each path, and how many records run opgen's
    one-shot all-reduce and all-gather kernels, from its report's notes."""
    notes = fn.report().notes
    reduces = [n for n in notes if n.startswith("all-reduce of node")]
    one_shot = sum(ONE_SHOT_NOTE in n for n in reduces)
    return {"one_shot": one_shot, "process group": len(reduces) - one_shot,
            "peer_sum records": sum("(`peer_sum`)" in n for n in notes),
            "peer_gather records": sum("(`peer_gather`)" in n for n in notes)}  # fmt: skip


def tp_block(route: str) -> Callable[[int, int], dict[str, Any]]:
    def case(rank: int, world: int) -> dict[str, Any]:
        import opgen

        device = torch.device("cuda", rank)
        torch.manual_seed(0)
        whole = Block().eval().to(device)
        x = torch.randn(2, 5, 32, device=device)
        model = ShardedBlock(whole, rank, world).eval().to(device)
        errors: dict[str, float] = {}
        with torch.no_grad():
            expected = whole(x)
            plain = opgen.compile(model, (x,), passes=_passes(route), cache=False)
            errors["opgen.compile"] = (plain(x) - expected).abs().max().item()
            errors["opgen.compile again"] = (plain(x * 2) - whole(x * 2)).abs().max().item()
            graphs = opgen.compile(model, (x,), passes=_passes(route), cache=False, cuda_graphs=True)
            for i in range(3):  # captured, then replayed on new values
                y = x + i
                errors[f"cuda_graphs call {i}"] = (graphs(y) - whole(y)).abs().max().item()
            torch.cuda.synchronize()
        return {"errors": errors, "routes": _routes(plain)}

    return case


def tp_decoder(route: str) -> Callable[[int, int], dict[str, Any]]:
    """The bench's gpt-fast Llama (tiny widths, float32) split over the ranks (`tp_models.shard`), in
    CUDA-graph mode, against the whole model over a few decode steps."""

    def case(rank: int, world: int) -> dict[str, Any]:
        import opgen

        device = torch.device("cuda", rank)
        shape, context, steps = dm.SHAPES["tiny"], 12, 4
        ids = [torch.tensor([[(7 * p + 3) % shape.vocab]], device=device) for p in range(context + steps)]
        pos = [torch.tensor([p], device=device) for p in range(context + steps)]
        with torch.no_grad():
            model = dm.gpt_fast(shape, context + steps, device)
            fill_caches(model, context)
            expected = [model(ids[p], pos[p]) for p in range(context, context + steps)]
            model = shard(model, rank, world, dist.group.WORLD)
            fast = opgen.compile(model, (ids[0], pos[0]), passes=_passes(route), cache=False, cuda_graphs=True)
            got = [fast(ids[p], pos[p]).clone() for p in range(context, context + steps)]
            torch.cuda.synchronize()
        scale = max(e.abs().max().item() for e in expected)
        errors = {f"step {i}": (g - e).abs().max().item() / scale for i, (g, e) in enumerate(zip(got, expected))}
        return {"errors": errors, "routes": _routes(fast), "tokens": [int(g.argmax()) for g in got],
                "expected tokens": [int(e.argmax()) for e in expected]}  # fmt: skip

    return case


def peer_gather_calls(rank: int, world: int) -> dict[str, Any]:
    """opgen's all-gather kernel (`execution.peer_gather`) against NCCL's, bit for bit: per dtype and size
    (odd ones, and the bench's logits at TP=2), calls of fresh values eager, then captured in a CUDA graph
    and replayed (the epochs on the device). Returns the mismatches and opgen's warnings (a fallback; torch's
    own, such as the barrier's note on its device, are not this test's)."""
    import warnings

    from opgen.runtime.execution.collectives import issuer
    from opgen.runtime.ir import Collective

    group = dist.group.WORLD
    device = torch.device("cuda", rank)
    mismatches: list[str] = []
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for dtype in (torch.bfloat16, torch.float32, torch.float16):
            for numel in (1, 4097, 64128):
                name = str(dtype).removeprefix("torch.")
                spec = Collective(f"t_{name}_{numel}", "peer_gather", group.group_name, world, dtype=name, numel=numel)
                gather = issuer(spec, group)
                x = torch.empty(numel, dtype=dtype, device=device)
                out = torch.empty(world * numel, dtype=dtype, device=device)
                want = torch.empty_like(out)

                def fresh(call: int, x: torch.Tensor = x) -> None:
                    x.copy_(torch.randn(x.numel(), generator=torch.Generator().manual_seed(97 * call + rank)))

                for call in range(5):  # each slot twice, and one more
                    fresh(call)
                    gather(out, x)
                    dist.all_gather_into_tensor(want, x, group=group)
                    if not torch.equal(out, want):
                        mismatches.append(f"{name} {numel}: eager call {call}")
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    gather(out, x)
                for call in range(5, 10):
                    fresh(call)
                    graph.replay()
                    dist.all_gather_into_tensor(want, x, group=group)
                    if not torch.equal(out, want):
                        mismatches.append(f"{name} {numel}: replay {call}")
        torch.cuda.synchronize(device)
    ours = [str(w.message) for w in warned if str(w.message).startswith("opgen")]
    return {"mismatches": mismatches, "warnings": ours}


def a_peer_never_calls(kind: str) -> Callable[[int, int], dict[str, Any]]:
    """Every rank binds `kind` ("peer_sum" or "peer_gather": its buffer is mapped, a collective call) with a
    1-second wait; then rank 0 alone calls it and waits for the GPU. Rank 0 returns the error its wait raised
    and the seconds it took; the other ranks return at once. Rank 0's CUDA context is gone after it: these
    ranks serve this one case."""

    def case(rank: int, world: int) -> dict[str, Any]:
        return _never_called(kind, rank, world)

    return case


def _never_called(kind: str, rank: int, world: int) -> dict[str, Any]:
    import os
    import time

    from opgen.runtime.execution.collectives import issuer
    from opgen.runtime.ir import Collective

    os.environ["OPGEN_PEER_TIMEOUT_S"] = "1"
    group, device = dist.group.WORLD, torch.device("cuda", rank)
    spec = Collective(f"t_{kind}", kind, group.group_name, world, "sum", dtype="float32", numel=1024)
    call = issuer(spec, group)
    if rank != 0:
        return {}
    x = torch.ones(1024, device=device)
    args = (x,) if kind == "peer_sum" else (torch.empty(world * 1024, device=device), x)
    start = time.monotonic()
    try:
        call(*args)
        torch.cuda.synchronize(device)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return {"error": error, "seconds": time.monotonic() - start}


CASES: dict[str, Callable[[int, int], Any]] = {
    **{
        f"{name}_{route}": make(route)
        for name, make in (("tp_block", tp_block), ("tp_decoder", tp_decoder))
        for route in ("peer_sum", "one_shot", "nccl")
    },
    "peer_gather_calls": peer_gather_calls,
    **{f"a_peer_never_calls_{kind}": a_peer_never_calls(kind) for kind in ("peer_sum", "peer_gather")},
}
