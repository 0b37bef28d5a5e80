"""`python -m opgen.bench tp_step`: where a tensor-parallel rank's decode step goes, kernel by kernel.

The `tp` bench's model (`decode_models.gpt_fast` at `--shape` widths, bf16, its cache filled to
`--context` positions) split over `--tp` ranks as `tp_models.shard` splits it; `--tiny` is the small
float32 version on the CPU over gloo. Every rank compiles its shard with `opgen.compile` (CUDA graphs on
CUDA), then, in lockstep (their collectives pair up), times `--calls` steps back to back and profiles
five, as `python -m opgen.bench step` does for one GPU (`step_profile`). Rank 0 prints its step's time
and its kernels, the longest first: name, what the report says each generated kernel is, launches a
step and a layer, us a launch and a step. On CUDA the rows are the GPU's activities; with dependent
launch on (Hopper and newer) they overlap, and `OPGEN_DEPENDENT_LAUNCH=0` gives times that add up.

opgen's default pipeline puts decode's collectives in its own kernels over peer memory (`peer_sum`,
`peer_gather`), so the profiled graphs hold no NCCL kernel (CUPTI tracing of graphs holding NCCL's
once hung the `tp` bench's ranks: `tp_rank`).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from opgen.bench.step_profile import (
    REPEATS,
    Profile,
    dependent_launch,
    descriptions,
    ranked,
    report,
    step_kernels,
    step_time_us,
)
from opgen.bench.tp_launch import join, keep_multicast_off, leave, spawn

TIMEOUT_SECONDS = 900  # for rank 0's profile: building, compiling and tuning an 8B shard takes minutes


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, outbox: Any) -> None:
    import torch.distributed as dist

    import opgen
    from opgen.bench import decode_models as dm
    from opgen.bench.tp_models import fill_caches, shard

    cuda = args.device == "cuda"
    device = join(rank, world, port, args.device, TIMEOUT_SECONDS)
    shape = dm.SHAPES[args.shape]
    with torch.no_grad():
        model = dm.gpt_fast(shape, args.context + 8, device)
        fill_caches(model, args.context)
        model = shard(model, rank, world, dist.group.WORLD if world > 1 else None)
        ids, pos = torch.tensor([[7]], device=device), torch.tensor([args.context], device=device)
        fn = opgen.compile(model, (ids, pos), cache=False, cuda_graphs=cuda)
        for _ in range(3):  # the first call compiles and picks; then the graph replays
            fn(ids, pos)
        step_us = step_time_us(lambda: fn(ids, pos), args.calls, args.repeats, cuda)
        kernels = step_kernels(lambda: fn(ids, pos), cuda)
        what = descriptions(fn.report().jit)
    text = None
    if rank == 0:
        dependent = cuda and dependent_launch()
        where = torch.cuda.get_device_name(device) if cuda else "cpu"
        profile = Profile(f"gpt-fast Llama, rank 0 of {world}", args.shape, 1, where,
                          str(shape.dtype).removeprefix("torch."), shape.layers, step_us, dependent,
                          ranked(kernels, what), args.repeats)  # fmt: skip
        text = report(profile, args.rows)
    leave(rank, world, outbox, text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench tp_step", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("1b", "8b"), default="1b", help="Llama-3.2-1B or Llama-3.1-8B widths")
    parser.add_argument("--tiny", action="store_true", help="a small float32 model on the CPU over gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tp", type=int, default=2, help="ranks (one GPU each on CUDA)")
    parser.add_argument("--context", type=int, default=512, help="cache positions filled before the step")
    parser.add_argument("--calls", type=int, default=50, help="steps back to back per timed sample")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed samples (the median is reported)")
    parser.add_argument("--rows", type=int, default=30, help="kernels shown, the longest first")
    args = parser.parse_args(argv)
    if min(args.tp, args.calls, args.repeats, args.rows, args.context) < 1:
        parser.error("--tp, --calls, --repeats, --rows and --context take positive numbers")
    if args.tiny:
        args.shape, args.device, args.context = "tiny", "cpu", min(args.context, 24)
    if args.device == "cuda" and args.tp > torch.cuda.device_count():
        parser.error(f"--tp {args.tp} needs {args.tp} GPUs, this machine has {torch.cuda.device_count()}")
    keep_multicast_off()
    text, _ = spawn(_rank, args.tp, args)
    if text is None:
        print("tp_step: a rank failed (its traceback is above)")
        return 1
    print(text)
    return 0
