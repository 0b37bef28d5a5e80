"""The model zoo: architectures from Hugging Face `transformers`, built from small configs.

Random weights, nothing downloaded: each entry builds a config with small sizes and the model class
from it, in eval mode, wrapped so that `forward` takes tensors and returns the model's main output
(`last_hidden_state`, or the pooled/feature output of vision models) as one tensor. Needs the
`zoo` extra (`pip install -e .[zoo]`); importing this module without `transformers` raises
ImportError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers as tf
from torch import nn

SEQ = 32  # tokens per text input
IMAGE = 64  # pixels per side of vision inputs
_TEXT = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256}


@dataclass(frozen=True, slots=True)
class ZooModel:
    """One architecture: its name, family and a builder of (module, example inputs)."""

    name: str
    family: str  # encoder | decoder | encoder-decoder | vision-transformer | cnn
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]


class MainOutput(nn.Module):
    """Calls the model with keyword tensors and returns its first output as a tensor."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.keys, tensors, strict=True)))
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def _eval(model: nn.Module, keys: tuple[str, ...]) -> nn.Module:
    return MainOutput(model.eval(), keys).eval()


def _tokens(vocab: int = 1000) -> torch.Tensor:
    return torch.randint(0, vocab, (1, SEQ), generator=torch.Generator().manual_seed(0))


def _text(model_cls: Any, config: Any, with_mask: bool = True) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = model_cls(config)
    ids = _tokens(config.vocab_size)
    if not with_mask:
        return _eval(model, ("input_ids",)), (ids,)
    mask = torch.ones(1, SEQ, dtype=torch.long)
    mask[0, -4:] = 0  # padding: the attention mask is not all ones
    return _eval(model, ("input_ids", "attention_mask")), (ids, mask)


def _seq2seq(model_cls: Any, config: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = model_cls(config)
    ids = _tokens(config.vocab_size)
    return _eval(model, ("input_ids", "decoder_input_ids")), (ids, ids[:, : SEQ // 2].clone())


def _vision(model_cls: Any, config: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = model_cls(config)
    pixels = torch.randn(1, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0))
    return _eval(model, ("pixel_values",)), (pixels,)


def _decoder_config(config_cls: Any, **extra: Any) -> Any:
    return config_cls(vocab_size=1000, max_position_embeddings=128, use_cache=False, **_TEXT, **extra)


def _models() -> tuple[ZooModel, ...]:
    def enc(cls_name: str, **kw: Any) -> Callable[[], Any]:
        config = getattr(tf, cls_name + "Config")
        return lambda: _text(getattr(tf, cls_name + "Model"), config(vocab_size=1000, **(_TEXT | kw)))

    def dec(cls_name: str, config: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: _text(getattr(tf, cls_name + "Model"), config())

    return (
        ZooModel("bert", "encoder", enc("Bert")),
        ZooModel("roberta", "encoder", enc("Roberta", pad_token_id=1)),
        ZooModel("albert", "encoder", enc("Albert", embedding_size=64)),
        ZooModel("electra", "encoder", enc("Electra", embedding_size=64)),
        ZooModel("distilbert", "encoder", lambda: _text(tf.DistilBertModel, _distilbert())),
        ZooModel("gpt2", "decoder", dec("GPT2", _gpt2)),
        ZooModel("gpt_neo", "decoder", dec("GPTNeo", _gpt_neo)),
        ZooModel("opt", "decoder", dec("OPT", _opt)),
        ZooModel("llama", "decoder", dec("Llama", lambda: _decoder_config(tf.LlamaConfig, num_key_value_heads=2))),
        ZooModel(
            "mistral", "decoder", dec("Mistral", lambda: _decoder_config(tf.MistralConfig, num_key_value_heads=2))
        ),
        ZooModel("qwen2", "decoder", dec("Qwen2", lambda: _decoder_config(tf.Qwen2Config, num_key_value_heads=2))),
        ZooModel("t5", "encoder-decoder", lambda: _seq2seq(tf.T5Model, _t5())),
        ZooModel("bart", "encoder-decoder", lambda: _seq2seq(tf.BartModel, _bart())),
        ZooModel("vit", "vision-transformer", lambda: _vision(tf.ViTModel, _vit(tf.ViTConfig))),
        ZooModel("deit", "vision-transformer", lambda: _vision(tf.DeiTModel, _vit(tf.DeiTConfig))),
        ZooModel("swin", "vision-transformer", lambda: _vision(tf.SwinModel, _swin())),
        ZooModel("convnext", "cnn", lambda: _vision(tf.ConvNextModel, _convnext())),
        ZooModel("resnet", "cnn", lambda: _vision(tf.ResNetModel, _resnet())),
        ZooModel("regnet", "cnn", lambda: _vision(tf.RegNetModel, _regnet())),
        ZooModel("mobilenet_v2", "mobile-cnn", lambda: _vision(tf.MobileNetV2Model, _mobilenet_v2())),
        ZooModel("efficientnet", "mobile-cnn", lambda: _vision(tf.EfficientNetModel, _efficientnet())),
    )


def _distilbert() -> Any:
    return tf.DistilBertConfig(vocab_size=1000, dim=128, n_layers=2, n_heads=4, hidden_dim=256)


def _gpt2() -> Any:
    return tf.GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=2, n_head=4, use_cache=False)


def _gpt_neo() -> Any:
    return tf.GPTNeoConfig(
        vocab_size=1000,
        max_position_embeddings=128,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=16,
        use_cache=False,
    )


def _opt() -> Any:
    return tf.OPTConfig(
        vocab_size=1000,
        max_position_embeddings=128,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=256,
        word_embed_proj_dim=128,
        use_cache=False,
    )


def _t5() -> Any:
    return tf.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4, use_cache=False)


def _bart() -> Any:
    return tf.BartConfig(
        vocab_size=1000,
        max_position_embeddings=128,
        d_model=128,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        use_cache=False,
    )


def _vit(config_cls: Any) -> Any:
    return config_cls(image_size=IMAGE, patch_size=8, **_TEXT)


def _swin() -> Any:
    return tf.SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4)


def _convnext() -> Any:
    return tf.ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1])


def _resnet() -> Any:
    return tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])


def _regnet() -> Any:
    return tf.RegNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], groups_width=16)


def _mobilenet_v2() -> Any:
    return tf.MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.5)


def _efficientnet() -> Any:
    return tf.EfficientNetConfig(image_size=IMAGE, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280)


ZOO: tuple[ZooModel, ...] = _models()
BY_NAME = {m.name: m for m in ZOO}
