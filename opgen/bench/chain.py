"""`python -m opgen.bench chain`: a decoder's chain of products as one persistent launch, against one
launch a product, each replayed as a CUDA graph (issue 39: "where a persistent kernel beats a chain of
launches, measure it and take it").

A decode step is a chain of products, each reading its whole weight once and needing all of the one
before's result: per layer q/k/v, the output projection, the gated gate/up pair and the down projection.
The chain here is those products alone, at a real model's widths, random bf16 weights (no norms, attention
or residual: what is measured is what each link of the chain costs beyond its reads). The ways:

- `launches`: one kernel a product (a program per tile), launched back to back;
- `dependent`: the same kernels launched dependently (compute capability 9.0+): each reads its first
  weights, then waits for the kernel before (`gdc_wait`), as opgen's generated products do;
- `persistent` (one row only): one kernel for the whole chain, `--per-sm` programs an SM, each taking
  every P-th tile of each product. Between two products every program bumps the product's counter (a
  release at GPU scope after its stores); a program's first tile of the next product reads its first
  weights, then waits for all P bumps (an acquire) before it reads the product's input. Every program must
  be resident at once, or the waits never end: a `--per-sm` the compiled kernel cannot keep resident (its
  registers, shared memory, threads) is refused before it runs.

With `--rows M` (2 to 64: batched decode) the products take M rows, their tiles on the FMA units (each
row times each weight row, summed along K at the end, as opgen's one-row kernels) or with `--dot` on
tensor cores (a block of the rows, padded to 16, times a tile of the weight, as opgen's few-row kernels).

Each row of the output gives microseconds a step (median of `--repeats` interleaved samples of replays,
`opgen.bench.timing.interleaved`), the weights' bytes over that time as a % of copy bandwidth, and the result
against torch's products of the same weights (over the first two layers: `_errors` says why). `--device cpu`
runs the tiny widths in Triton's interpreter (one program, nothing timed): a check of the kernels (not
`--dot`'s: the interpreter's bfloat16 dots are wrong). Measured figures: docs/jit-and-fusion.md (A persistent
chain).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass, replace

import torch

from opgen.bench.timing import interleaved
from opgen.runtime.codegen.triton.module import next_power_of_2

# (hidden, q/k/v rows, MLP width, layers) of real checkpoints: Llama-3.2-1B, Qwen2.5-0.5B, Llama-3.1-8B
WIDTHS = {
    "1b": (2048, 3072, 8192, 16),
    "qwen": (896, 1152, 4864, 24),
    "8b": (4096, 6144, 14336, 32),
    "tiny": (64, 96, 128, 2),
}
CHECKED_LAYERS = 2  # layers of the chain whose result is checked against torch's (`_errors`)
REPEATS = 7  # interleaved samples (`--repeats`); the median is reported
TARGET_S = 0.04  # seconds of replays a sample (about 50 of a 1B chain)


@dataclass(frozen=True, slots=True)
class Chain:
    hidden: int
    qkv: int
    inter: int
    layers: int
    w_qkv: torch.Tensor  # [L, qkv, hidden]
    w_o: torch.Tensor  # [L, hidden, hidden]
    w_g: torch.Tensor  # [L, inter, hidden]
    w_u: torch.Tensor  # [L, inter, hidden]
    w_d: torch.Tensor  # [L, hidden, inter]

    @property
    def weight_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in (self.w_qkv, self.w_o, self.w_g, self.w_u, self.w_d))


def make_chain(widths: str, device: torch.device, layers: int | None = None, seed: int = 0) -> Chain:
    hidden, qkv, inter, n = WIDTHS[widths]
    n = layers or n
    g = torch.Generator(device=device).manual_seed(seed)

    def weight(rows: int, cols: int) -> torch.Tensor:
        w = torch.randn(n, rows, cols, generator=g, device=device, dtype=torch.float32) / math.sqrt(cols)
        return w.to(torch.bfloat16)

    return Chain(hidden, qkv, inter, n, weight(qkv, hidden), weight(hidden, hidden), weight(inter, hidden),
                 weight(inter, hidden), weight(hidden, inter))  # fmt: skip


def reference(chain: Chain, x: torch.Tensor) -> torch.Tensor:
    """The chain in torch for x's rows ([M, hidden]): each product in float32 from bf16 inputs, rounded to
    bf16 as the kernels store."""
    h = x.float()
    for layer in range(chain.layers):
        qkv = (h @ chain.w_qkv[layer].float().T).bfloat16().float()
        o = (qkv[:, : chain.hidden] @ chain.w_o[layer].float().T).bfloat16().float()
        gate = (o @ chain.w_g[layer].float().T).bfloat16().float()
        up = (o @ chain.w_u[layer].float().T).bfloat16().float()
        gu = (torch.nn.functional.silu(gate) * up).bfloat16().float()
        h = (gu @ chain.w_d[layer].float().T).bfloat16().float()
    return h


def _kernels():
    """The kernels' module, imported late: Triton reads TRITON_INTERPRET when it makes them."""
    from opgen.bench import chain_kernels

    return chain_kernels


@dataclass(frozen=True, slots=True)
class Tiles:
    """Rows a tile (q/k/v, output, gate/up, down), columns a step of K (down's apart), warps."""

    qkv: int = 4
    o: int = 4
    gu: int = 2
    d: int = 4
    block_k: int = 1024
    block_kd: int = 2048
    warps: int = 4
    stages: int = 3  # software pipelining of a few-row kernel's loads
    dot: bool = False  # a few-row kernel's tiles on tensor cores (else on the FMA units)

    def describe(self) -> str:
        return (f"rows {self.qkv}/{self.o}/{self.gu}/{self.d}, K blocks {self.block_k}/{self.block_kd}, "
                f"{self.warps} warps")  # fmt: skip

    def describe_rows(self) -> str:
        return f"{self.describe()}, {self.stages} stages, {'tensor cores' if self.dot else 'FMA'}"


@dataclass(frozen=True, slots=True)
class Product:
    """One product of the chain: y = x[:, :k] @ w.T (a gated pair: silu(x @ w0.T) * (x @ w1.T)), n columns."""

    weights: tuple[torch.Tensor, ...]  # one, or a gate's and an up's
    x: torch.Tensor
    y: torch.Tensor
    n: int
    k: int
    row_stride: int  # x's
    block_n: int
    block_k: int


class Runner:
    """The chain's buffers and its three ways, each a function that runs one step."""

    def __init__(self, chain: Chain, tiles: Tiles, programs: int, rows: int = 1) -> None:
        self.chain, self.tiles, self.programs, self.rows = chain, tiles, programs, rows
        device = chain.w_o.device

        def buffer(width: int) -> torch.Tensor:
            return torch.zeros(rows, width, device=device, dtype=torch.bfloat16)

        self.h, self.qkv = buffer(chain.hidden), buffer(chain.qkv)
        self.o, self.gu = buffer(chain.hidden), buffer(chain.inter)
        self.counters = torch.zeros(4 * chain.layers, device=device, dtype=torch.int32)
        self.kernels = _kernels()

    def load(self, x: torch.Tensor) -> None:
        self.h.copy_(x)

    def products(self, layer: int) -> list[Product]:
        """The layer's four products in order, each with its tile's rows and K block."""
        c, t = self.chain, self.tiles
        return [
            Product((c.w_qkv[layer],), self.h, self.qkv, c.qkv, c.hidden, c.hidden, t.qkv, t.block_k),
            Product((c.w_o[layer],), self.qkv, self.o, c.hidden, c.hidden, c.qkv, t.o, t.block_k),  # q's columns
            Product((c.w_g[layer], c.w_u[layer]), self.o, self.gu, c.inter, c.hidden, c.hidden, t.gu, t.block_k),
            Product((c.w_d[layer],), self.gu, self.h, c.hidden, c.inter, c.inter, t.d, t.block_kd),
        ]

    def launches(self, dependent: bool = False) -> None:
        """A kernel a product; a few rows' kernels take the rows (their block padded to a power of two, at
        least 16 on tensor cores), their row stride and the pipeline's stages."""
        t, m, k = self.tiles, self.rows, self.kernels
        options = {"num_warps": t.warps, **({"launch_pdl": True} if dependent else {})}
        block_m = max(16 if t.dot else 1, next_power_of_2(m))
        for layer in range(self.chain.layers):
            for p in self.products(layer):
                grid = (_cdiv(p.n, p.block_n),)
                if m == 1:
                    kernel = k.gated_kernel if len(p.weights) == 2 else k.product_kernel
                    kernel[grid](*p.weights, p.x, p.y, p.n, p.k, p.block_n, p.block_k, dependent, **options)
                else:
                    kernel = k.rows_gated_kernel if len(p.weights) == 2 else k.rows_product_kernel
                    kernel[grid](*p.weights, p.x, p.y, m, p.n, p.k, p.row_stride, block_m, p.block_n, p.block_k,
                                 t.dot, dependent, num_stages=t.stages, **options)  # fmt: skip

    def _persistent_args(self) -> tuple:
        c, t = self.chain, self.tiles
        return (c.w_qkv, c.w_o, c.w_g, c.w_u, c.w_d, self.h, self.qkv, self.o, self.gu, self.counters, c.layers,
                c.hidden, c.qkv, c.inter, self.programs, t.qkv, t.o, t.gu, t.d, t.block_k, t.block_kd)  # fmt: skip

    def check_resident(self) -> None:
        """Refuses a grid whose programs the GPU cannot all hold at once (its waits would never end)."""
        device = self.chain.w_o.device
        if device.type != "cuda":
            return  # the interpreter runs the one program alone
        compiled = self.kernels.persistent_kernel.warmup(*self._persistent_args(), grid=(self.programs,),
                                                         num_warps=self.tiles.warps)  # fmt: skip
        try:
            compiled._init_handles()  # loads the binary: its registers a thread are known from then on
            registers, shared = int(compiled.n_regs), int(compiled.metadata.shared)
        except AttributeError as e:  # another Triton: not run, rather than risk waiting forever
            raise ValueError(f"opgen.bench chain: cannot tell how many programs an SM holds ({e})") from None
        each = resident_programs(registers, shared, self.tiles.warps, sm_limits(device))
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if self.programs > each * sms:
            raise ValueError(
                f"opgen.bench chain: {self.programs} persistent programs, but an SM holds {each} of this kernel "
                f"({registers} registers a thread, {shared} bytes of shared memory, "
                f"{self.tiles.warps} warps): at most --per-sm {each}"
            )

    def persistent(self) -> None:
        self.counters.zero_()
        self.kernels.persistent_kernel[(self.programs,)](*self._persistent_args(), num_warps=self.tiles.warps)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def resident_programs(registers: int, shared: int, warps: int, sm: Mapping[str, int]) -> int:
    """Programs of a kernel an SM holds at once: by its threads, registers (allocated per warp in units of
    256) and shared memory, on an SM with `sm`'s limits ("threads", "registers", "shared", "blocks")."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_threads = sm["threads"] // (32 * warps)
    by_registers = sm["registers"] // (per_warp * warps)
    by_shared = sm["shared"] // shared if shared else sm["blocks"]
    return min(by_threads, by_registers, by_shared, sm["blocks"])


def sm_limits(device: torch.device) -> dict[str, int]:
    props = torch.cuda.get_device_properties(device)
    return {
        "threads": getattr(props, "max_threads_per_multi_processor", 2048),
        "registers": getattr(props, "regs_per_multiprocessor", 65536),
        "shared": getattr(props, "shared_memory_per_multiprocessor", 233472),
        "blocks": 32,
    }


def _graph(step, runner: Runner, x: torch.Tensor):
    """`step` captured in a CUDA graph after warm-up calls; returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            runner.load(x)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _ways(runner: Runner) -> dict[str, Callable[[], None]]:
    """The ways to run the runner's chain here: the persistent one at one row (its grid checked resident
    first), the dependent one where the device launches that way."""
    ways = {"launches": runner.launches}
    if runner.rows == 1:
        runner.check_resident()
        ways["persistent"] = runner.persistent
    device = runner.chain.w_o.device
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9:
        ways["dependent"] = lambda: runner.launches(dependent=True)
    return ways


def _errors(chain: Chain, tiles: Tiles, programs: int, x: torch.Tensor) -> dict[str, float]:
    """Each way's result over the chain's first CHECKED_LAYERS layers against torch's: max |difference| over
    max |torch's|. Products without norms between them shrink the values layer after layer (the gated pair
    squares them) until they are zero, where any result would match: a longer chain checks nothing more."""
    checked = replace(chain, layers=min(chain.layers, CHECKED_LAYERS))
    want = reference(checked, x)
    scale = float(want.abs().max())
    if scale == 0.0:
        raise RuntimeError("opgen.bench chain: torch's chain is all zeros: nothing to check the kernels against")
    runner = Runner(checked, tiles, programs, x.shape[0])
    errors = {}
    for name, step in _ways(runner).items():
        runner.load(x)
        step()
        errors[name] = float((runner.h.float() - want).abs().max()) / scale
    if "persistent" in errors:  # after its run: every program bumped every product's counter once
        bumps = runner.counters.tolist()
        if bumps != [programs] * len(bumps):
            raise RuntimeError(f"opgen.bench chain: the persistent kernel's counters read {sorted(set(bumps))}, "
                               f"not {programs} each")  # fmt: skip
    return errors


def run(widths: str, device: torch.device, tiles: Tiles, programs: int, layers: int | None = None,
        rows: int = 1, repeats: int = REPEATS) -> list[dict]:  # fmt: skip
    """One dict a way: "way", "us" (median; None where nothing is timed: the CPU), "min_us", "max_us",
    "bandwidth" (a fraction of copy bandwidth), "error" (`_errors`)."""
    chain = make_chain(widths, device, layers)
    x = torch.randn(rows, chain.hidden, device=device, generator=torch.Generator(device).manual_seed(1)).bfloat16()
    errors = _errors(chain, tiles, programs, x)
    if device.type != "cuda":
        return [{"way": name, "us": None, "min_us": None, "max_us": None, "bandwidth": None, "error": err}
                for name, err in errors.items()]  # fmt: skip
    from opgen.bench.timing import copy_bandwidth

    bandwidth = copy_bandwidth(device)
    runner = Runner(chain, tiles, programs, rows)
    replays = [_graph(step, runner, x) for step in _ways(runner).values()]
    timings = interleaved(replays, repeats=repeats, target_s=TARGET_S, sync=lambda: torch.cuda.synchronize(device))
    result = []
    for (name, error), t in zip(errors.items(), timings, strict=True):
        result.append({"way": name, "us": t.median_us, "min_us": t.min_us, "max_us": t.max_us,
                       "bandwidth": chain.weight_bytes / (t.median_us * 1e-6) / bandwidth, "error": error})  # fmt: skip
    return result


def _tiles(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Tiles:
    try:
        values = [int(v) for v in args.tiles.split(",")]
    except ValueError:
        values = []
    if len(values) != 7 or any(v < 1 or v & (v - 1) for v in values):
        parser.error(f"--tiles {args.tiles}: seven powers of two (rows of q/k/v, output, gate/up, down; K block; "
                     "down's K block; warps)")  # fmt: skip
    tiles = Tiles(*values, stages=args.stages, dot=args.dot)
    if args.dot and min(tiles.qkv, tiles.o, tiles.gu, tiles.d, tiles.block_k, tiles.block_kd) < 16:
        parser.error("--dot: tensor-core tiles take at least 16 rows and 16 columns of K")
    return tiles


def _arguments(argv: list[str]) -> tuple[argparse.Namespace, Tiles]:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench chain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", choices=sorted(WIDTHS), help="default: 1b on CUDA, tiny on the CPU")
    parser.add_argument("--layers", type=int, default=None, help="layers (default: the model's)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--per-sm", type=int, default=1, help="persistent programs per SM")
    parser.add_argument("--tiles", default=",".join(str(v) for v in astuple(Tiles())[:7]),
                        help="rows a tile of q/k/v, output, gate/up, down; K block; down's K block; warps")  # fmt: skip
    parser.add_argument("--rows", type=int, default=1, help="input rows (batched decode); over 1: no persistent way")
    parser.add_argument("--stages", type=int, default=3, help="a few-row kernel's pipeline stages")
    parser.add_argument("--dot", action="store_true", help="a few-row kernel's tiles on tensor cores (not FMA)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed samples (the median is reported)")
    args = parser.parse_args(argv)
    args.widths = args.widths or ("1b" if args.device == "cuda" else "tiny")
    tiles = _tiles(parser, args)
    if not 1 <= args.rows <= 64:
        parser.error(f"--rows {args.rows}: 1 to 64")
    if args.per_sm < 1 or args.repeats < 1 or args.stages < 1 or (args.layers is not None and args.layers < 1):
        parser.error("--per-sm, --repeats, --stages and --layers take a positive count")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.device == "cpu" and args.widths != "tiny":
        parser.error(f"--device cpu runs Triton's interpreter: --widths tiny, not {args.widths}")
    if args.device == "cpu" and args.dot:
        parser.error("--dot runs on CUDA only: Triton's interpreter computes bfloat16 tl.dot wrongly, so the "
                     "chain's check against torch would fail there")  # fmt: skip
    return args, tiles


def main(argv: list[str]) -> int:
    args, tiles = _arguments(argv)
    device, cuda = torch.device(args.device), args.device == "cuda"
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
    try:
        import triton  # noqa: F401
    except ImportError:
        print("opgen.bench chain: needs triton (on the CPU, for its interpreter)", file=sys.stderr)
        return 2
    programs = torch.cuda.get_device_properties(device).multi_processor_count * args.per_sm if cuda else 1
    try:
        rows = run(args.widths, device, tiles, programs, args.layers, args.rows, args.repeats)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if cuda else "cpu (Triton's interpreter)"
    how = f"{programs} persistent programs, tiles: {tiles.describe()}" if args.rows == 1 else \
        f"{args.rows} rows, tiles: {tiles.describe_rows()}"  # fmt: skip
    print(f"chain of {args.widths} widths, {args.layers or WIDTHS[args.widths][3]} layers, bf16, {name}, {how}")
    for row in rows:
        us = f"{row['us']:8.1f} us ({row['min_us']:.1f}-{row['max_us']:.1f})" if row["us"] else "   (not timed)"
        bw = f"{100 * row['bandwidth']:5.1f}% of copy BW" if row["bandwidth"] else ""
        print(f"  {row['way']:11s} {us}  {bw}  error {row['error']:.1e}")
    return 0
