"""`python -m opgen.bench tp`: a Llama-style decoder split over N processes (tensor parallelism, issue 22).

Each decoding step takes one new token and attends to a fixed-length context (a static KV cache held
as buffers). Every layer is pre-norm (RMSNorm), attention with its heads split over the ranks
(q/k/v column-parallel, o row-parallel, then `dist.all_reduce`) and a SwiGLU MLP (gate/up
column-parallel, down row-parallel, then `dist.all_reduce`). Per-token time, interleaved per
../shared/BENCH.md (all ranks call in lockstep, a barrier before each repeat; rank 0's median, min and
max over the repeats):

- eager, Inductor (`torch.compile`) and opgen (`opgen.compile`, strict) on N ranks;
- the same three with the whole model in one process (N=1) beside them.

CPU: gloo on 127.0.0.1, N=2 by default, one thread per rank. CUDA (`--device cuda`, one GPU per
rank): NCCL, and opgen in CUDA-graph mode (the collectives are captured into the graph).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Layer(nn.Module):
    """One decoder layer holding `heads` of the attention heads and `hidden` of the MLP's width."""

    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, context: int, world: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.world = heads, head_dim, world
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.register_buffer("cache_k", torch.randn(1, heads, context, head_dim))
        self.register_buffer("cache_v", torch.randn(1, heads, context, head_dim))

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(1, 1, 3, self.heads, self.head_dim).unbind(2)
        k = torch.cat([self.cache_k, k.transpose(1, 2)], dim=2)
        v = torch.cat([self.cache_v, v.transpose(1, 2)], dim=2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k, v)
        h = x + self.reduce(self.o(a.transpose(1, 2).reshape(1, 1, -1)))
        gate, up = self.gate_up(self.norm2(h)).chunk(2, dim=-1)
        return h + self.reduce(self.down(F.silu(gate) * up))


class Decoder(nn.Module):
    def __init__(self, sizes: dict[str, int], world: int) -> None:
        super().__init__()
        dim, heads, hidden = sizes["dim"], sizes["heads"], sizes["hidden"]
        self.layers = nn.ModuleList(
            Layer(dim, heads // world, dim // heads, hidden // world, sizes["context"], world)
            for _ in range(sizes["layers"])
        )
        self.norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


SIZES = {
    "tiny": {"dim": 128, "heads": 4, "hidden": 256, "layers": 2, "context": 64},
    "full": {"dim": 2048, "heads": 16, "hidden": 5632, "layers": 8, "context": 1024},
}


def candidates(model: nn.Module, x: torch.Tensor, cuda: bool) -> dict[str, Callable[[], Any]]:
    import opgen

    return {
        "eager": lambda: model(x),
        # Inductor: reduce-overhead (CUDA graphs) on CUDA, as opgen's graph mode there; its default on the CPU.
        "inductor": (lambda f: lambda: f(x))(torch.compile(model, mode="reduce-overhead" if cuda else "default")),
        "opgen": (lambda f: lambda: f(x))(opgen.compile(model, (x,), cuda_graphs=cuda, cache=False)),
    }


Times = dict[str, tuple[float, float, float]]


def time_steps(
    fns: dict[str, Callable[[], Any]], calls: int, repeats: int, sync: Callable[[], None], lockstep: bool = True
) -> Times:
    """Microseconds per step: {name: (median, min, max)}. With `lockstep`, every rank runs the same calls in
    the same order, a barrier before each repeat (the collectives would deadlock otherwise)."""
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(3):
                fn()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                if lockstep:
                    dist.barrier()
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in samples.items()}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sizes = SIZES["tiny" if args.tiny else "full"]
    x = torch.randn(1, 1, sizes["dim"], device=device)
    rows = []
    with torch.no_grad():
        torch.manual_seed(0)
        split = Decoder(sizes, world).eval().to(device)
        rows.append((f"N={world}", time_steps(candidates(split, x, cuda), args.calls, args.repeats, sync)))
        dist.barrier()
        if rank == 0:  # the whole model in this one process
            torch.manual_seed(0)
            whole = Decoder(sizes, 1).eval().to(device)
            rows.append(("N=1", time_steps(candidates(whole, x, cuda), args.calls, args.repeats, sync, False)))
        dist.barrier()
    if rank == 0:
        print(table(rows, sizes, world, args.device))
    dist.destroy_process_group()


def table(rows: list[tuple[str, Times]], sizes: dict[str, int], world: int, device: str) -> str:
    names = ("eager", "inductor", "opgen")
    mode = "reduce-overhead" if device == "cuda" else "default"
    head = f"tensor-parallel decoder, {device}, {sizes}: per-token time, us (median [min, max]); inductor: {mode}"
    lines = [head, f"{'ranks':6s}" + "".join(f"{n:>26s}" for n in names) + f"{'opgen/eager':>13s}"]
    for label, times in rows:
        cells = "".join(f"{times[n][0]:10.1f} [{times[n][1]:6.1f},{times[n][2]:7.1f}]" for n in names)
        lines.append(f"{label:6s}{cells}{times['opgen'][0] / times['eager'][0]:12.2f}x")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench tp", description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="processes (ranks); default 2")
    parser.add_argument("--tiny", action="store_true", help="small sizes: runs in under a minute on 2 CPU cores")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--calls", type=int, default=20, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        parser.error(f"--device cuda needs {args.world} GPUs, this machine has {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, args.world, port, args)) for r in range(args.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode or 0 for p in procs)
