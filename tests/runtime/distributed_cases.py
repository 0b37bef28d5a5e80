"""Cases for tests/runtime/test_distributed.py, run inside each rank's process (so importable by name).

Each case takes (rank, world) with a gloo process group initialised on the loopback address, and
returns plain data (numbers, strings) for the test to check. Models are built whole from one seed
in every rank; the tensor-parallel version of a rank holds its shard of the same weights, and its
result is compared with the whole model run in this one process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class ShardedMLP(nn.Module):
    """Column-parallel up projection, row-parallel down projection, `dist.all_reduce` on the output."""

    def __init__(self, full: MLP, rank: int, world: int) -> None:
        super().__init__()
        rows = full.up.weight.shape[0] // world
        part = slice(rank * rows, (rank + 1) * rows)
        self.up_w = nn.Parameter(full.up.weight[part].clone())
        self.up_b = nn.Parameter(full.up.bias[part].clone())
        self.down_w = nn.Parameter(full.down.weight[:, part].clone())
        self.down_b = nn.Parameter(full.down.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(F.gelu(F.linear(x, self.up_w, self.up_b)), self.down_w)
        dist.all_reduce(y)
        return y + self.down_b


class Block(nn.Module):
    """A pre-norm transformer block: causal multi-head attention, then an MLP, each with a residual."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)
        self.mlp = MLP(dim, hidden)

    def attention(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, heads, -1).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.norm1(x), self.heads)
        return h + self.mlp(self.norm2(h))


class ShardedBlock(nn.Module):
    """`Block` with its attention heads split over the ranks (q/k/v column-parallel, o row-parallel) and its
    MLP split as `ShardedMLP`; the norms are replicated."""

    def __init__(self, full: Block, rank: int, world: int) -> None:
        super().__init__()
        self.heads = full.heads // world
        dim = full.q.weight.shape[0] // world
        part = slice(rank * dim, (rank + 1) * dim)
        self.norm1, self.norm2 = full.norm1, full.norm2
        self.q, self.k, self.v = (nn.Linear(dim * world, dim, bias=False) for _ in range(3))
        for mine, theirs in ((self.q, full.q), (self.k, full.k), (self.v, full.v)):
            mine.weight = nn.Parameter(theirs.weight[part].clone())
        self.o = nn.Linear(dim, dim * world, bias=False)
        self.o.weight = nn.Parameter(full.o.weight[:, part].clone())
        self.mlp = ShardedMLP(full.mlp, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm1(x)
        b, t, _ = n.shape
        q, k, v = (proj(n).view(b, t, self.heads, -1).transpose(1, 2) for proj in (self.q, self.k, self.v))
        attn = self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))
        dist.all_reduce(attn)
        h = x + attn
        return h + self.mlp(self.norm2(h))


def compare(model: nn.Module, whole: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """Max abs error of opgen.compile and torch.compile(backend="opgen") (both strict) vs the whole model."""
    import opgen

    with torch.no_grad():
        expected = whole(x)
        errors = {"eager": (model(x) - expected).abs().max().item()}
        fast = opgen.compile(model, (x,))
        errors["opgen.compile"] = (fast(x) - expected).abs().max().item()
        errors["opgen.compile again"] = (fast(x * 2) - whole(x * 2)).abs().max().item()
        cached = opgen.compile(model, (x,))  # from the disk cache: bound to the group again
        assert cached.artifact.from_cache, "the second compile should load the graph from the disk cache"
        errors["opgen.compile from the cache"] = (cached(x) - expected).abs().max().item()
        compiled = torch.compile(model, backend="opgen", options={"fallback": False})
        errors["torch.compile"] = (compiled(x) - expected).abs().max().item()
        executor = _cpp(model, x)  # the collectives are the C++ program's externs
        errors["opgen.compile backend=cpp"] = (executor(x) - expected).abs().max().item()
    return errors


def _cpp(model: nn.Module, x: torch.Tensor) -> Any:
    """opgen.compile(backend="cpp"), which must run on the C++ executor (a fallback is an error)."""
    import warnings

    import opgen

    with warnings.catch_warnings():
        warnings.simplefilter("error", opgen.OpgenWarning)
        fn = opgen.compile(model, (x,), backend="cpp")
    assert type(fn).__name__ == "CppFunction", fn.report()
    return fn


def tp_mlp(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    whole = MLP().eval()
    x = torch.randn(3, 16)
    return compare(ShardedMLP(whole, rank, world).eval(), whole, x)


def tp_block(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    whole = Block().eval()
    x = torch.randn(2, 5, 32)
    return compare(ShardedBlock(whole, rank, world).eval(), whole, x)


CASES: dict[str, Callable[[int, int], Any]] = {"tp_mlp": tp_mlp, "tp_block": tp_block}


def dtensor_plan(rank: int, world: int) -> dict[str, Any]:
    """`parallelize_module` with ColwiseParallel/RowwiseParallel, the weights the whole model's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import opgen

    torch.manual_seed(0)
    whole = MLP().eval()
    x = torch.randn(3, 16)
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(MLP().eval(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(distribute_tensor(whole.get_parameter(name), mesh, p.placements))
        expected = whole(x)
        errors: dict[str, Any] = {"eager": (model(x) - expected).abs().max().item()}
        compiled = torch.compile(model, backend="opgen", options={"fallback": False})
        errors["torch.compile"] = (compiled(x) - expected).abs().max().item()
        with warnings.catch_warnings():  # a graph left on Python (its DTensor specs) would warn
            warnings.simplefilter("error", opgen.OpgenWarning)
            torch._dynamo.reset()
            on_cpp = torch.compile(model, backend="opgen", options={"fallback": False, "backend": "cpp"})
            errors["torch.compile backend=cpp"] = (on_cpp(x) - expected).abs().max().item()
        try:
            torch.export.export(model, (x,))
        except RuntimeError:  # torch 2.13's export refuses DTensor parameters (their specs are no pytree)
            errors["export refuses"] = 0.0
        else:
            errors["opgen.compile"] = (opgen.compile(model, (x,))(x) - expected).abs().max().item()
    return errors


class Collectives(nn.Module):
    """Every functional collective opgen lowers, on the default group."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import torch.distributed._functional_collectives as funcol

        group = dist.group.WORLD
        if hasattr(funcol, "all_gather_single"):
            gathered = funcol.all_gather_single(x.t(), 0, group)  # a strided input: opgen gathers a dense copy
        else:  # torch 2.11 (the GPU machine's): all_gather_tensor, which takes contiguous tensors only
            gathered = funcol.all_gather_tensor(x.t().contiguous(), 0, group)
        scattered = funcol.reduce_scatter_tensor(x * 2, "sum", 0, group)  # as reduce_scatter_single, in both
        exchanged = funcol.all_to_all_single(x + 1, None, None, group)
        broadcast = funcol.broadcast(x - 1, 1, group)
        c1, c2 = funcol.all_reduce_coalesced([x, x * 3], "max", group)
        smallest = funcol.all_reduce(x, "min", group)
        return gathered + 0, scattered + 0, exchanged + 0, broadcast + 0, c1 + 0, c2 + 0, smallest + 0


def collectives(rank: int, world: int) -> dict[str, Any]:
    import opgen

    x = torch.arange(24.0).reshape(4, 6) * (rank + 1)
    model = Collectives()
    with torch.no_grad():
        expected = [t.clone() for t in model(x)]
        fast = opgen.compile(model, (x,))
        compiled = torch.compile(model, backend="opgen", options={"fallback": False})
        got = {"opgen.compile": fast(x), "torch.compile": compiled(x), "opgen.compile backend=cpp": _cpp(model, x)(x)}
    errors = {k: max((a - b).abs().max().item() for a, b in zip(v, expected, strict=True)) for k, v in got.items()}
    source = fast.artifact.source
    errors["kinds"] = sorted({c.kind for c in fast.artifact.collectives})
    errors["waits"] = source.split("def forward_profiled")[0].count("c10d_wait(")
    return errors


class Overlap(nn.Module):
    """An all_reduce with independent work after it: the wait goes after that work."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        dist.all_reduce(y)
        z = torch.relu(self.b(x))
        return y + z


def overlap(rank: int, world: int) -> dict[str, Any]:
    import opgen

    torch.manual_seed(0)
    model = Overlap().eval()
    x = torch.randn(4, 16) + rank
    with torch.no_grad():
        expected = model(x)
        fast = opgen.compile(model, (x,))
        error = (fast(x) - expected).abs().max().item()
    lines = [line.strip() for line in fast.artifact.source.split("def forward(")[1].splitlines()]
    order = [next(i for i, t in enumerate(lines) if key in t) for key in ("c10d_all_reduce(", "relu", "c10d_wait(")]
    forward = lines[: next(i for i, t in enumerate(lines) if t.startswith("def forward_profiled"))]
    return {"error": error, "order": order, "copies": sum(t.startswith(("copy", "clone")) for t in forward)}


class Gather4(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops._c10d_functional.all_gather_into_tensor(x, 4, dist.group.WORLD.group_name)
        return torch.ops._c10d_functional.wait_tensor(out)


def wrong_group_size(rank: int, world: int) -> str:
    """A graph traced for a group of 4 ranks, compiled where group '0' has 2."""
    import opgen
    from opgen.runtime.execution.collectives import ProcessGroupError

    try:
        opgen.compile(Gather4(), (torch.ones(2),))
    except ProcessGroupError as exc:
        return str(exc)
    return "no error"


CASES["dtensor_plan"] = dtensor_plan
CASES["collectives"] = collectives
CASES["overlap"] = overlap
CASES["wrong_group_size"] = wrong_group_size


def hang(rank: int, world: int) -> None:
    """Rank 0 waits for a collective no other rank joins (the harness must stop it)."""
    if rank == 0:
        dist.all_reduce(torch.ones(1))


CASES["hang"] = hang
