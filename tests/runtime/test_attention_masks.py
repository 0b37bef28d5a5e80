"""Boolean attention masks converted to additive ones once per graph, not in every attention call."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.runtime.pipeline import default_pipeline


class Layers(nn.Module):
    """Attention layers that all read one boolean padding mask (BERT's shape of the problem)."""

    def __init__(self, layers: int = 3, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(layers))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        mask = keep[:, None, None, :]  # [b, 1, 1, t]: keys to attend to
        for qkv in self.qkv:
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in qkv(x).chunk(3, dim=-1))
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, c)
        return x


class ConstantCausal(nn.Module):
    """A causal mask built from the sizes alone: a constant, converted at load."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        return F.scaled_dot_product_attention(a, k, v, attn_mask=causal) + a


def _masks_lines(compiled: object) -> tuple[str, str]:
    source = compiled.artifact.source  # type: ignore[attr-defined]
    forward = source[source.index("    def forward(") :]
    return source[: source.index("    def forward(")], forward[: forward.index("def forward_profiled")]


def test_one_conversion_serves_every_layer_and_the_results_match_eager() -> None:
    model, x = Layers().eval(), torch.randn(2, 6, 32)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 4:] = False  # the second sequence is padded
    with torch.no_grad():
        compiled = opgen.compile(model, (x, keep), cache=False)
        expected = model(x, keep)
        got = compiled(x, keep)
        without = [p for p in default_pipeline() if p != "attention_masks"]
        unconverted = opgen.compile(model, (x, keep), cache=False, passes=without)(x, keep)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert torch.equal(got, unconverted)  # the same additive mask ATen made in each call
    _, forward = _masks_lines(compiled)
    lines = forward.splitlines()
    for op in ("logical_not", "masked_fill", "zeros_like"):  # each call once, whatever variant memory planning made
        assert sum(op in line for line in lines) == 1, forward
    assert sum("scaled_dot_product_attention(" in line for line in lines) == 3


def test_a_constant_mask_is_converted_in_setup() -> None:
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    model = ConstantCausal().eval()
    with torch.no_grad():
        compiled = opgen.compile(model, (q, k, v), cache=False)
        torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=0, atol=1e-6)
    setup, forward = _masks_lines(compiled)
    assert "logical_not" not in forward and "masked_fill" not in forward, forward
    assert "masked_fill" in setup


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_masks_and_no_mask_pass_through(dtype: torch.dtype) -> None:
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=dtype) for _ in range(3))
    bias = torch.randn(5, 5, dtype=dtype)

    class Additive(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias) + F.scaled_dot_product_attention(q, k, v)

    with torch.no_grad():
        compiled = opgen.compile(Additive(), (q, k, v, bias), cache=False)
        torch.testing.assert_close(compiled(q, k, v, bias), Additive()(q, k, v, bias), rtol=0, atol=0)
    assert "logical_not" not in compiled.artifact.source
