"""opgen's CUDA graphs beside everything else a process may do with CUDA memory (run as a script).

`python coexistence_steps.py STEP [STEP ...]` compiles three models in CUDA-graph mode, one for each
kind of kernel a graph records: cuBLAS GEMMs (an MLP), cuDNN convolutions (a conv net) and opgen's
generated Triton kernels beside cuBLAS (a transformer block, fused). Then it runs the steps in order;
after each one, every opgen graph alive must still give eager's answer, and memory that others
allocated since (filled with a sentinel) must still hold it. It exits 0 when all held, 1 with the
step and the model when an answer was wrong; a CUDA error (an illegal memory access) ends it too.

It runs in a process of its own (tests/runtime/test_cuda_coexistence.py): a graph replaying into
freed memory can poison the CUDA context, and every later test in that process would fail with it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import opgen

SENTINEL = 1234.5
SCRIBBLE_MB = (8, 16, 32, 32, 64)  # sizes around cuBLAS's workspaces (32 MiB on Hopper, 8 MiB before)


class Mlp(nn.Module):
    """cuBLAS: thin and wide GEMMs (split-K algorithms use the workspace)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(1024, 4096)
        self.down = nn.Linear(4096, 1024)
        self.head = nn.Linear(1024, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.relu(self.up(x))) + x)


class ConvNet(nn.Module):
    """cuDNN: convolutions with batch norm (folded) and residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32))
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        return self.pool(torch.relu(self.body(y) + y)).flatten(1)


class Block(nn.Module):
    """Triton (layer norm, gelu, softmax fused by opgen) beside cuBLAS: a pre-norm decoder block."""

    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], float]] = {
    "mlp": (Mlp, lambda: torch.randn(2, 1024, device="cuda"), 1e-3),
    "convnet": (ConvNet, lambda: torch.randn(2, 3, 32, 32, device="cuda"), 1e-3),
    "block": (Block, lambda: torch.randn(1, 16, 256, device="cuda"), 1e-3),
}
OTHER = (lambda: nn.Sequential(Mlp(), nn.Linear(64, 512)), MODELS["mlp"][1], 1e-3)  # a model opgen never saw


class World:
    """The opgen graphs alive, their eager twins, and what the steps allocated and keep."""

    def __init__(self) -> None:
        self.graphs: dict[str, tuple[Any, nn.Module, Callable[[], torch.Tensor], float]] = {}
        self.kept: list[Any] = []  # other compilers' models, user graphs: alive until `destroy`
        self.scribbles: list[torch.Tensor] = []

    def add(self, name: str, model_name: str | None = None) -> None:
        make, inputs, tol = MODELS[model_name or name]
        torch.manual_seed(len(self.graphs))
        model = make().cuda().eval()
        with torch.no_grad():
            fast = opgen.compile(model, (inputs(),), cuda_graphs=True)
            fast(inputs())
            fast(inputs())
        report = str(fast.report())
        assert "CUDA graph: captured" in report, report
        self.graphs[name] = (fast, model, inputs, tol)

    def check(self, step: str) -> None:
        torch.cuda.synchronize()
        for name, (fast, model, inputs, tol) in self.graphs.items():
            for _ in range(3):
                x = inputs()
                with torch.no_grad():
                    out, ref = fast(x), model(x)
                torch.cuda.synchronize()
                err = float((out - ref).abs().max() / ref.abs().max())
                if not err <= tol:
                    fail(f"after '{step}': opgen graph '{name}' is off eager's answer by {err:.3g} (rel)")
        for t in self.scribbles:
            if not bool((t == SENTINEL).all()):
                fail(f"after '{step}': memory allocated after a workspace was freed no longer holds its values")
        print(f"ok: {step} ({len(self.graphs)} graphs)", flush=True)

    def scribble(self) -> None:
        """Take the memory just freed (on the current and the graphs' side streams) and fill it."""
        self.scribbles += [torch.full((mb << 18,), SENTINEL, device="cuda") for mb in SCRIBBLE_MB]


def fail(message: str) -> None:
    print(f"FAILED: {message}", flush=True)
    sys.exit(1)


def clear_cublas(w: World) -> None:
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    w.scribble()


def empty_cache(w: World) -> None:
    gc.collect()
    torch.cuda.empty_cache()
    w.scribble()


def reduce_overhead(w: World, model_name: str) -> None:
    """torch.compile(mode="reduce-overhead") of the model an opgen graph was made from, else a new one."""
    make, inputs, _ = OTHER if model_name == "other" else MODELS[model_name]
    model = w.graphs[model_name][1] if model_name in w.graphs else make().cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            compiled(inputs())
    torch.cuda.synchronize()
    w.kept.append(compiled)
    w.scribble()


def user_graph(w: World) -> None:
    """A user's own capture: a GEMM and a convolution in torch.cuda.graph (which empties the cache)."""
    a, b = torch.randn(512, 4096, device="cuda"), torch.randn(4096, 512, device="cuda")
    conv = nn.Conv2d(3, 8, 3).cuda()
    img = torch.randn(1, 3, 32, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        a @ b, conv(img)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = (a @ b, conv(img))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    if not torch.allclose(out[0], a @ b, rtol=1e-2, atol=1e-2):
        fail("the user's own graph gave a wrong product")
    w.kept.append((graph, out))


def second_opgen(w: World) -> None:
    w.add(f"mlp#{len(w.graphs)}", "mlp")


def destroy(w: World) -> None:
    """Destroy graphs: other compilers', the user's, and an opgen graph (its pool goes with it)."""
    w.kept.clear()
    torch._dynamo.reset()
    for name in [n for n in w.graphs if "#" in n]:
        del w.graphs[name]
    gc.collect()
    torch.cuda.empty_cache()
    w.scribble()


STEPS: dict[str, Callable[[World], None]] = {
    "clear_cublas": clear_cublas,
    "empty_cache": empty_cache,
    "reduce_overhead_same": lambda w: [reduce_overhead(w, name) for name in ("mlp", "block")],
    "reduce_overhead_other": lambda w: reduce_overhead(w, "other"),
    "user_graph": user_graph,
    "second_opgen": second_opgen,
    "destroy": destroy,
}


def main(steps: list[str]) -> int:
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        print(f"unknown steps {unknown}; known: {', '.join(STEPS)}")
        return 2
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    w = World()
    for name in MODELS:
        w.add(name)
    w.check("capture")
    for step in steps:
        STEPS[step](w)
        w.check(step)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
