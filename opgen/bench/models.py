"""The BENCH.md graph cases as plain `nn.Module`s (torchvision is not a dependency).

`resnet18()` is the standard ResNet-18 (BasicBlock, [2, 2, 2, 2], 1000 classes) in eval mode with
batch-norm statistics that are not the identity, so folding them is exercised. `GPTBlock` is one
pre-norm transformer decoder block: layer_norm, fused qkv linear, causal attention written with
matmul/softmax, an MLP with gelu.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class SingleAdd(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class ReshapeAdd(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.reshape(4, 4) + y.reshape(4, 4)).reshape(16)


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(seed: int = 0) -> ResNet18:
    """ResNet-18 in eval mode with seeded weights and non-trivial batch-norm running statistics."""
    torch.manual_seed(seed)
    model = ResNet18()
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            with torch.no_grad():
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
                assert module.running_mean is not None and module.running_var is not None
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model.eval()


class GPTBlock(nn.Module):
    def __init__(self, width: int = 256, heads: int = 4, tokens: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.register_buffer("mask", torch.tril(torch.ones(tokens, tokens, dtype=torch.bool)))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        scores = scores.masked_fill(~mask[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def gpt_block(seed: int = 0, width: int = 256, tokens: int = 16) -> GPTBlock:
    torch.manual_seed(seed)
    return GPTBlock(width=width, tokens=tokens).eval()


@dataclass(frozen=True, slots=True)
class Case:
    """A BENCH.md graph case: a model factory and its example inputs."""

    name: str
    model: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    heavy: bool = False  # skipped by `--quick`


def cases() -> tuple[Case, ...]:
    return (
        Case("single_add", SingleAdd, lambda: (torch.randn(16), torch.randn(16))),
        Case("reshape_add", ReshapeAdd, lambda: (torch.randn(16), torch.randn(16))),
        Case("resnet18_b1", resnet18, lambda: (torch.randn(1, 3, 224, 224),), heavy=True),
        Case("resnet18_b10", resnet18, lambda: (torch.randn(10, 3, 224, 224),), heavy=True),
        Case("gpt_block", gpt_block, lambda: (torch.randn(1, 16, 256),)),
        *decode_cases(),
    )


DECODE_CACHE = 64  # cache positions; each call writes position 32 (the same work every call)


def decode_step() -> nn.Module:
    """One decode step of a tiny Llama in transformers' static-cache export wrapper: every call writes
    the key/value cache buffers in place (the graph case that writes state)."""
    from opgen.bench import decode_models

    return decode_models.hf_llama(decode_models.SHAPES["tiny"], DECODE_CACHE, torch.device("cpu"))


def decode_cases() -> tuple[Case, ...]:
    """The decode step, where transformers is installed (the zoo extra)."""
    if importlib.util.find_spec("transformers") is None:
        return ()
    return (Case("decode_step", decode_step, lambda: (torch.tensor([[7]]), torch.tensor([DECODE_CACHE // 2]))),)
