"""One rank of `python -m opgen.bench tp`: build its shard, check the candidates, time them in lockstep.

Every rank builds the whole model from one seed (`decode_models.gpt_fast`), fills its caches with the
same keys and values up to `plan.context`, records the whole model's logits at the checked positions
(eager), then keeps only its shard (`tp_models.shard`). Per candidate, built and called on every rank
in the same order (their collectives pair up):

- check: logits at the checked positions against the whole model's, on rank 0: max |error| over
  max |logit| within `decode.TOLERANCE`, or within `decode_families.RO_SLACK` times
  reduce-overhead's error at the same TP size (bf16 sums in another order); tokens = argmax agree;
- time: per repeat a barrier, then one step per timed position, each synchronized; the median step,
  then median, min and max over the repeats (candidates interleaved). Then the same steps back to back,
  one synchronization at the end (`timing.back_to_back`: a loop feeding each token back on the device
  waits for no step);
- the all-reduces' share of the step (CUDA, N > 1): the step's all-reduces alone (two a layer of one
  token's hidden state, NCCL's or the one-shot kernel, as the candidate runs them), captured in a
  CUDA graph and replayed, over the candidate's median step. (Not from the profiler: CUPTI tracing
  of graphs holding NCCL kernels hung the ranks.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from opgen.bench import decode
from opgen.bench import decode_models as dm
from opgen.bench.memory import free_memory
from opgen.bench.timing import back_to_back
from opgen.bench.tp_models import fill_caches, shard

REPLAYS = 20  # replays of the all-reduces alone


@dataclass(frozen=True, slots=True)
class Plan:
    shape: str
    context: int  # cache positions filled before the checked steps
    check: int  # checked steps (positions context .. context + check - 1)
    steps: int  # timed positions after them
    repeats: int

    @property
    def max_seq(self) -> int:
        return self.context + self.check + self.steps


@dataclass(frozen=True, slots=True)
class Row:
    """One candidate at one TP size, as rank 0 measured it."""

    tp: int
    candidate: str
    us: float | None  # median step, us
    low: float | None
    high: float | None
    bandwidth: float | None  # bytes this rank reads per step / step time / copy bandwidth
    reduce_share: float | None  # the step's all-reduces alone / step time (CUDA, N > 1)
    tokens: str  # "k/n" argmax equal to the whole model's
    error: float | None  # max |logit error| / max |logit|
    ok: bool | None
    note: str = ""
    back_to_back: float | None = None  # median step, us, the steps enqueued back to back


# opgen's variants on N > 1 ranks: name -> (the passes left out, the route of its all-reduces alone). The
# all-reduce variants leave the logits' all-gather on NCCL too, as before `peer_gather` was built.
VARIANTS = {
    "opgen": ((), "peer_sum"),
    "opgen (torch one-shot)": (("peer_sum", "peer_gather"), "one_shot"),
    "opgen (NCCL all-reduce)": (("peer_sum", "one_shot_all_reduce", "peer_gather"), "nccl"),
    "opgen (NCCL all-gather)": (("peer_gather",), "peer_sum"),
}


def candidates(cuda: bool, world: int) -> dict[str, Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], Any]]:
    """Name -> builder. On CUDA with N > 1, opgen again with torch's one-shot kernel for its small all-reduces
    (the `peer_sum` pass left out), with every all-reduce on NCCL (both one-shot passes left out), both with
    the logits' all-gather on NCCL (`peer_gather` left out), and with only that all-gather on NCCL."""
    import opgen
    from opgen.runtime.pipeline import default_pipeline

    graphs = {"cuda_graphs": True} if cuda else {}
    built: dict[str, Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], Any]] = {
        "eager": lambda m, _: m,
        "reduce-overhead" if cuda else "inductor": lambda m, _: torch.compile(
            m, mode="reduce-overhead" if cuda else "default"
        ),
        "opgen": lambda m, x: opgen.compile(m, x, cache=False, **graphs),
    }
    if cuda and world > 1:
        for name, (left_out, _) in VARIANTS.items():
            if not left_out:
                continue  # "opgen" itself, built above
            passes = tuple(p for p in default_pipeline() if p not in left_out)
            built[name] = lambda m, x, passes=passes: opgen.compile(m, x, passes=passes, cache=False, **graphs)
    return built


def run(rank: int, world: int, plan: Plan, device: torch.device, copy_bw: float) -> list[Row]:
    """This rank's part of one TP size; rank 0's rows (the others return [])."""
    shape = dm.SHAPES[plan.shape]
    cuda = device.type == "cuda"
    checked = range(plan.context, plan.context + plan.check)
    timed = range(plan.context + plan.check, plan.max_seq)
    ids = [torch.tensor([[(97 * p + 13) % shape.vocab]], device=device) for p in range(plan.max_seq)]
    pos = [torch.tensor([p], device=device) for p in range(plan.max_seq)]
    say = (lambda what: print(f"  TP={world}: {what} ({time.perf_counter() - start:.0f} s)", flush=True)) if rank == 0 \
        else (lambda what: None)  # fmt: skip
    start = time.perf_counter()
    with torch.no_grad():
        model = dm.gpt_fast(shape, plan.max_seq, device)
        fill_caches(model, plan.context)
        reference = torch.stack([model(ids[p], pos[p]).float().cpu() for p in checked])
        model = shard(model, rank, world, dist.group.WORLD if world > 1 else None)
        free_memory(device)
        say("whole model's logits taken, shard kept")
        per_step = dm.weight_bytes(model) + dm.kv_bytes_per_position(model) * round(statistics.mean(timed))
        steps: dict[str, Any] = {}
        results: dict[str, tuple[str, float | None, bool | None]] = {}
        failed: dict[str, str] = {}
        for name, build in candidates(cuda, world).items():
            try:
                step = build(model, (ids[0], pos[0]))
                for _ in range(decode.FIRST_CALLS.get("compile" if name == "reduce-overhead" else name, 1)):
                    step(ids[checked[0]], pos[checked[0]])
                logits = torch.stack([step(ids[p], pos[p]).float().cpu() for p in checked])
            except Exception as exc:  # a candidate's failure is a row note (every rank fails alike)
                failed[name] = decode.reason(exc)
                say(f"{name}: {failed[name]}")
                continue
            say(f"{name} built and checked")
            steps[name] = step
            results[name] = _agreement(logits, reference, shape.dtype)
        barrier = dist.barrier if world > 1 else None
        calls, inputs = list(steps.values()), [(ids[p], pos[p]) for p in timed]
        timed_ms = decode.time_steps(calls, inputs, plan.repeats, device, barrier)
        times = {name: tuple(ms * 1e3 for ms in t) for name, t in zip(steps, timed_ms, strict=True)}
        queued = back_to_back(calls, inputs, plan.repeats, device, barrier)
        chained = {name: ms * 1e3 for name, ms in zip(steps, queued, strict=True)}
        say("timed")
        shares: dict[str, float] = {}
        if cuda and world > 1:
            try:
                routes = dict.fromkeys(route for _, route in VARIANTS.values())  # each timed once
                alone = {route: _reduces_alone(shape, route, world, device) for route in routes}
            except Exception as exc:  # the table goes on without the share
                say(f"all-reduces alone: {decode.reason(exc)}")
            else:
                say("all-reduces alone, us a step: " + ", ".join(f"{r} {us:.1f}" for r, us in alone.items()))
                shares = {name: alone[VARIANTS.get(name, ((), "nccl"))[1]] / times[name][0] for name in steps}
    if rank != 0:
        return []
    return _rows(plan, world, times, chained, results, failed, shares, per_step, copy_bw)


def _agreement(logits: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> tuple[str, float, bool]:
    equal = int((logits.argmax(-1) == reference.argmax(-1)).all(-1).sum())
    error = float((logits - reference).abs().max() / reference.abs().max())
    return f"{equal}/{len(reference)}", error, error <= decode.TOLERANCE[dtype]


def _reduces_alone(shape: dm.Shape, route: str, world: int, device: torch.device) -> float:
    """us a step spends in its all-reduces alone: 2 a layer of [1, 1, hidden], on `route`, graph-replayed."""
    from opgen.runtime.execution.collectives import issuer
    from opgen.runtime.ir import Collective

    group = dist.group.WORLD
    x = torch.zeros(1, 1, shape.hidden, dtype=shape.dtype, device=device)
    if route in ("one_shot", "peer_sum"):
        dtype = str(shape.dtype).removeprefix("torch.")
        kind = "one_shot_all_reduce" if route == "one_shot" else "peer_sum"
        spec = Collective(f"bench_{route}", kind, group.group_name, world, "sum", dtype=dtype, numel=shape.hidden)
        reduce = issuer(spec, group)
    else:
        reduce = dist.all_reduce
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            reduce(x)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(2 * shape.layers):
            reduce(x)
    graph.replay()
    torch.cuda.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(REPLAYS):
        graph.replay()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / REPLAYS * 1e6


def _rows(plan: Plan, world: int, times: dict[str, tuple[float, float, float]], chained: dict[str, float],
          results: dict[str, tuple[str, float | None, bool | None]], failed: dict[str, str],
          shares: dict[str, float], per_step: int, copy_bw: float) -> list[Row]:  # fmt: skip
    from opgen.bench.decode_families import RO_SLACK

    bar = results.get("reduce-overhead", ("", None, None))[1]
    rows = []
    for name in (*results, *failed):
        if name in failed:
            rows.append(Row(world, name, None, None, None, None, None, "-", None, None, failed[name]))
            continue
        tokens, error, ok = results[name]
        if not ok and bar is not None and error is not None and name.startswith("opgen") and error <= RO_SLACK * bar:
            ok = True
        us, low, high = times[name]
        bandwidth = per_step / (us * 1e-6) / copy_bw
        rows.append(Row(world, name, us, low, high, bandwidth, shares.get(name), tokens, error, ok,
                        back_to_back=chained[name]))  # fmt: skip
    return rows
