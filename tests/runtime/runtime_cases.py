"""Graphs the correctness tests run through both entry points: every BENCH.md case (small) and more.

Each case is a model factory and an inputs factory; `mutates` marks models that write their inputs
or buffers, which the tests run on copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from opgen.bench import models


@dataclass(frozen=True)
class GraphCase:
    name: str
    model: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    mutates: bool = False
    atol: float = 1e-5


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> object:
        return self.fn(*args)


def _views(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = x.permute(0, 2, 1)[:, 1:3].unsqueeze(0).expand(2, -1, -1, -1)
    b = a.contiguous().transpose(-1, -2).reshape(2, -1)
    return b + y.select(0, 0).flatten().repeat(2)[: b.shape[1]]


def _multi_output(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    values, indices = torch.max(x, 1)
    a, b = x.split(2, dim=1)
    return values + a.sum(1), indices, b


def _in_place(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.add_(1)
    torch.relu_(y)
    y.mul_(y)
    return y.sub_(x)


def _mutate_input(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * 2


class BufferCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


class Constants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3))
        self.register_buffer("shift", torch.arange(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.0, -2.0, 0.5]) + self.weight * self.shift


def _scalars(x: torch.Tensor) -> torch.Tensor:
    y = (x * 2.5 + 1) / 3 - x**2 + torch.clamp(x, min=0.1, max=0.9)
    return y + torch.where(x > 0, x, 0.0) - 7


def _kwargs(x: torch.Tensor) -> torch.Tensor:
    y = F.softmax(x, dim=-1) + F.gelu(x, approximate="tanh") + torch.sum(x, dim=1, keepdim=True)
    return y + F.layer_norm(x, (x.shape[-1],), eps=1e-3)


def _nested_outputs(x: torch.Tensor) -> object:
    return {"max": torch.max(x, 1), "stats": [x.mean(), x.std()], "plus": (x + 1, x * 2)}


def _tuple_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x * y


def conv_bn_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=True), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16, affine=False), nn.ReLU(),
    )  # fmt: skip
    for bn in (net[1], net[5]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return net.eval()


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 16)).eval()


def _cat_stack(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, y], 1).sum(1) + torch.stack([x, y]).mean(0).sum(1)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(10, 8)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx).mean(1)


def _aliases(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x, x.view(-1), x.t(), x + 1


def _integers(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * 3 + b) - torch.remainder(a, b.abs() + 1)


def _masks(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where((x > 0) & (y < 0.5), x, y) + (~(x > y)).float()


def _r(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(*shape),)


CASES = [
    GraphCase("single_add", models.SingleAdd, lambda: (torch.randn(16), torch.randn(16))),
    GraphCase("reshape_add", models.ReshapeAdd, lambda: (torch.randn(16), torch.randn(16))),
    GraphCase("resnet18_small", models.resnet18, _r(1, 3, 32, 32), atol=1e-4),
    GraphCase("resnet18_small_b2", models.resnet18, _r(2, 3, 32, 32), atol=1e-4),
    GraphCase("gpt_block", lambda: models.gpt_block(width=64, tokens=8), _r(1, 8, 64), atol=1e-5),
    GraphCase("views", lambda: Fn(_views), lambda: (torch.randn(2, 3, 4), torch.randn(3, 8))),
    GraphCase("multi_output", lambda: Fn(_multi_output), _r(3, 4)),
    GraphCase("in_place", lambda: Fn(_in_place), _r(4, 5)),
    GraphCase("mutate_input", lambda: Fn(_mutate_input), _r(4), mutates=True),
    GraphCase("mutate_buffer", BufferCounter, _r(4), mutates=True),
    GraphCase("constants", Constants, _r(2, 3)),
    GraphCase("scalars", lambda: Fn(_scalars), _r(4, 4)),
    GraphCase("kwargs", lambda: Fn(_kwargs), _r(3, 5)),
    GraphCase("nested_outputs", lambda: Fn(_nested_outputs), _r(3, 4)),
    GraphCase("tuple_outputs", lambda: Fn(_tuple_outputs), lambda: (torch.randn(3), torch.randn(3))),
    GraphCase("conv_bn_pool", conv_bn_net, _r(2, 3, 12, 12), atol=1e-4),
    GraphCase("mlp", mlp, _r(4, 32)),
    GraphCase("cat_stack", lambda: Fn(_cat_stack), lambda: (torch.randn(2, 3), torch.randn(2, 3))),
    GraphCase("embedding", Embed, lambda: (torch.randint(0, 10, (2, 5)),)),
    GraphCase("aliases", lambda: Fn(_aliases), _r(3, 4)),
    GraphCase("integers", lambda: Fn(_integers), lambda: (torch.randint(-5, 5, (6,)), torch.randint(-5, 5, (6,)))),
    GraphCase("masks", lambda: Fn(_masks), lambda: (torch.randn(5), torch.rand(5))),
]
