"""`python -m opgen.bench tp`: a Llama decode step split over N processes (tensor parallelism).

The model is the decode bench's gpt-fast Llama (`decode_models`, random weights made on the device)
at a real shape, `--shape 1b` (Llama-3.2-1B) or `8b` (Llama-3.1-8B), bf16, batch 1, a static KV cache
filled up to `--context` positions, split over N ranks as gpt-fast splits it (`tp_models`: heads and
MLP width column/row-parallel with an all-reduce after each row-parallel product, the head split
over the vocabulary with an all-gather). `--tiny` is a small float32 version for the CPU.

Each N of `--tp` (default 1,2,4 on CUDA) starts N processes, one GPU each, NCCL (gloo on the CPU),
and runs `tp_rank.run` in them: candidates eager, reduce-overhead (Inductor's default on the CPU) and
opgen in CUDA-graph mode, and on N > 1 opgen's variants with some collectives left on NCCL
(`tp_rank.VARIANTS`: torch's one-shot all-reduce, every all-reduce, the logits' all-gather). Per
row: us per token (median [min, max], each step synchronized), speed-up over N=1, time / reduce-overhead's
at the same N, us per token with the steps enqueued back to back (one synchronization at the end) and its
speed-up over N=1, % of copy bandwidth per rank (the bytes a rank reads: its weights and its part of the cache), the
all-reduces' share of the step (`tp_rank`), and agreement with the whole model's logits (`tp_rank`).
This workplace keeps NVLink multicast off (`NCCL_NVLS_ENABLE=0`,
`TORCH_SYMM_MEM_DISABLE_MULTICAST=1`); the bench sets them where unset.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

import torch

from opgen.bench.timing import format_table
from opgen.bench.tp_launch import join, keep_multicast_off, leave, spawn
from opgen.bench.tp_rank import Plan, Row


def _rank(rank: int, world: int, port: int, plan: Plan, device_type: str, copy_bw: float, outbox: Any) -> None:
    from opgen.bench import tp_rank

    device = join(rank, world, port, device_type)
    rows = tp_rank.run(rank, world, plan, device, copy_bw)
    if rank == 0:
        print(table(rows, plan.shape, device_type, copy_bw), flush=True)
    leave(rank, world, outbox, [asdict(r) for r in rows])


def run_size(world: int, plan: Plan, device_type: str, copy_bw: float) -> list[Row]:
    """Rank 0's rows of one TP size, its N processes started and joined here."""
    rows, codes = spawn(_rank, world, plan, device_type, copy_bw)
    if rows is None:
        failed = ", ".join(f"rank {r}: {code}" for r, code in enumerate(codes))
        return [Row(world, "all", None, None, None, None, None, "-", None, None, f"ranks failed ({failed})")]
    return [Row(**r) for r in rows]


def table(rows: list[Row], shape: str, device: str, copy_bw: float) -> str:
    base = {r.candidate: r.us for r in rows if r.tp == 1}
    chained = {r.candidate: r.back_to_back for r in rows if r.tp == 1}
    ro = {r.tp: r.us for r in rows if r.candidate in ("reduce-overhead", "inductor")}
    headers = ["TP", "candidate", "us/token (min-max)", "x TP=1", "x r-o", "back to back (x TP=1)", "% copy BW/rank",
               "all-reduce share", "tokens", "max logit err", "note"]  # fmt: skip
    lines = []
    for r in rows:
        timed = r.us is not None
        one = base.get(r.candidate) or base.get("opgen")
        one_chained = chained.get(r.candidate) or chained.get("opgen")
        queued = f"{r.back_to_back:.1f}" if r.back_to_back is not None else "-"
        if r.back_to_back is not None and one_chained:
            queued += f" ({one_chained / r.back_to_back:.2f}x)"
        lines.append([
            str(r.tp), r.candidate,
            f"{r.us:.1f} ({r.low:.1f}-{r.high:.1f})" if timed else "-",
            f"{one / r.us:.2f}x" if timed and one else "-",
            f"{r.us / ro[r.tp]:.3f}" if timed and ro.get(r.tp) else "-",
            queued,
            f"{100 * r.bandwidth:.1f}" if r.bandwidth is not None else "-",
            f"{100 * r.reduce_share:.1f}%" if r.reduce_share is not None else "-",
            r.tokens,
            f"{r.error:.1e} ({'ok' if r.ok else 'NOT ok'})" if r.error is not None else "-",
            r.note,
        ])  # fmt: skip
    head = (f"tensor-parallel decode, {shape} shape, {device}, batch 1; copy bandwidth {copy_bw / 1e9:.0f} GB/s; "
            "x TP=1: the same candidate's N=1 time over this one (opgen's variants against opgen); us/token: each "
            "step synchronized; back to back: the steps enqueued with one synchronization at the end")  # fmt: skip
    return head + "\n" + format_table(headers, lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench tp", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("1b", "8b"), default="1b", help="Llama-3.2-1B or Llama-3.1-8B widths")
    parser.add_argument("--tiny", action="store_true", help="a small float32 model (runs in a minute on 2 CPU cores)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tp", default=None, help="comma-separated TP sizes (default 1,2,4 on CUDA, 1,2 on the CPU)")
    parser.add_argument("--context", type=int, default=512, help="cache positions filled before the steps")
    parser.add_argument("--check", type=int, default=4, help="steps checked against the whole model")
    parser.add_argument("--steps", type=int, default=32, help="timed positions per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    sizes = [int(n) for n in (args.tp or ("1,2,4" if cuda else "1,2")).split(",")]
    if cuda and max(sizes) > torch.cuda.device_count():
        parser.error(f"--tp {max(sizes)} needs {max(sizes)} GPUs, this machine has {torch.cuda.device_count()}")
    keep_multicast_off()
    shape = "tiny" if args.tiny else args.shape
    plan = Plan(shape, args.context if not args.tiny else 24, args.check, args.steps if not args.tiny else 8,
                args.repeats)  # fmt: skip
    from opgen.bench.timing import copy_bandwidth

    copy_bw = copy_bandwidth(torch.device("cuda", 0) if cuda else torch.device("cpu"))
    rows: list[Row] = []
    for world in sizes:
        print(f"TP={world}: {world} process(es) ...", flush=True)
        rows += run_size(world, plan, args.device, copy_bw)  # rank 0 prints this size's table
    where = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"\n== all sizes ({where}, torch {torch.__version__}) ==")
    print(table(rows, shape, args.device, copy_bw))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "torch": torch.__version__, "shape": shape, "plan": asdict(plan),
                       "copy_bandwidth": copy_bw, "rows": [asdict(r) for r in rows]}, f, indent=1)  # fmt: skip
    return 0 if all(r.us is not None for r in rows) else 1
