"""The models `python -m opgen.bench gpu_models` runs: real architectures from torchvision, timm and
transformers, at the sizes and dtypes users run them on a GPU.

Random weights, nothing downloaded. Each entry names the library it needs; a model whose library is
missing is skipped with that reason. `build(device)` returns (module in eval mode, in its dtype, on
the device; example inputs there). Transformers models are wrapped so that `forward` takes tensors
and returns the main output as one tensor (`zoo_models.MainOutput`), without a KV cache.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    library: str  # torchvision | timm | transformers
    dtype: torch.dtype
    what: str  # the row's description: architecture, dtype, batch
    make: Callable[[torch.dtype], Built]  # on the CPU, in `dtype`

    def missing(self) -> str | None:
        """Why this model cannot run here, or None."""
        if importlib.util.find_spec(self.library) is None:
            return f"{self.library} is not installed"
        return None

    def build(self, device: torch.device) -> Built:
        torch.manual_seed(0)
        model, inputs = self.make(self.dtype)
        model = model.eval().to(device)
        return model, tuple(t.to(device) for t in inputs)


def _images(batch: int, dtype: torch.dtype, side: int = 224) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(batch, 3, side, side, generator=gen).to(dtype),)


def _torchvision(arch: str, batch: int) -> Callable[[torch.dtype], Built]:
    def make(dtype: torch.dtype) -> Built:
        import torchvision

        return getattr(torchvision.models, arch)(weights=None).to(dtype), _images(batch, dtype)

    return make


def _timm(arch: str, batch: int) -> Callable[[torch.dtype], Built]:
    def make(dtype: torch.dtype) -> Built:
        import timm

        return timm.create_model(arch, pretrained=False).to(dtype), _images(batch, dtype)

    return make


def _bert(dtype: torch.dtype) -> Built:
    import transformers as tf

    from opgen.bench.zoo_models import MainOutput

    model = tf.BertModel(tf.BertConfig(attn_implementation="sdpa")).to(dtype)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 128), generator=gen)
    mask = torch.ones(2, 128, dtype=torch.long)
    mask[1, 100:] = 0  # padding: the second sequence is shorter
    return MainOutput(model, ("input_ids", "attention_mask")), (ids, mask)


def _decoder(arch: str, tokens: int, **config: Any) -> Callable[[torch.dtype], Built]:
    def make(dtype: torch.dtype) -> Built:
        import transformers as tf

        from opgen.bench.zoo_models import MainOutput

        cfg = getattr(tf, arch + "Config")(use_cache=False, attn_implementation="sdpa", **config)
        model = getattr(tf, arch + "ForCausalLM")(cfg).to(dtype)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=gen)
        return MainOutput(model, ("input_ids",)), (ids,)

    return make


_LLAMA = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
              intermediate_size=4096, vocab_size=32000)  # fmt: skip
_QWEN2 = dict(hidden_size=896, num_hidden_layers=12, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=32000)  # fmt: skip

MODELS: tuple[GpuModel, ...] = (
    GpuModel("resnet50", "torchvision", torch.float32, "torchvision ResNet-50 fp32, batch 8",
             _torchvision("resnet50", 8)),
    GpuModel("mobilenet_v3", "torchvision", torch.float32, "torchvision MobileNetV3-Large fp32, batch 1",
             _torchvision("mobilenet_v3_large", 1)),
    GpuModel("efficientnet_b0", "timm", torch.float32, "timm EfficientNet-B0 fp32, batch 4",
             _timm("efficientnet_b0", 4)),
    GpuModel("convnext_tiny", "timm", torch.float32, "timm ConvNeXt-Tiny fp32, batch 1", _timm("convnext_tiny", 1)),
    GpuModel("vit_b16", "timm", torch.bfloat16, "timm ViT-B/16 bf16, batch 4", _timm("vit_base_patch16_224", 4)),
    GpuModel("swin_tiny", "timm", torch.float16, "timm Swin-Tiny fp16, batch 2",
             _timm("swin_tiny_patch4_window7_224", 2)),
    GpuModel("bert", "transformers", torch.float16, "transformers BERT-base fp16, 2x128 tokens, padding mask", _bert),
    GpuModel("llama_prefill", "transformers", torch.bfloat16, "transformers Llama (1024 wide, 8 layers, GQA) bf16, "
             "64-token prefill", _decoder("Llama", 64, **_LLAMA)),
    GpuModel("qwen2_token", "transformers", torch.bfloat16, "transformers Qwen2 (896 wide, 12 layers) bf16, one token",
             _decoder("Qwen2", 1, **_QWEN2)),
)  # fmt: skip
NAMES = tuple(m.name for m in MODELS)
