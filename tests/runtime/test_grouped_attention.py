"""Grouped-query attention with several query rows: `enable_gqa` instead of the repeat of the key/value heads."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.runtime import passes
from opgen.runtime.execution.device_facts import device_facts
from opgen.runtime.ir import Program
from opgen.runtime.passes.grouped_attention import read_grouped_heads
from opgen.runtime.passes.relabel import relabel
from opgen.runtime.pipeline import default_pipeline
from opgen.runtime.registry import DeviceFacts, KernelRegistry


class Prefill(nn.Module):
    """transformers' repeat_kv before attention over a whole prompt (queries of every position)."""

    def __init__(self, heads: int = 8, kv_heads: int = 2, dim: int = 16) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim
        self.q = nn.Linear(heads * dim, heads * dim)
        self.kv = nn.Linear(heads * dim, 2 * kv_heads * dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.dim).transpose(1, 2) for z in self.kv(x).chunk(2, dim=-1))
        group = self.heads // self.kv_heads
        k, v = (z[:, :, None].expand(b, self.kv_heads, group, t, self.dim).reshape(b, self.heads, t, self.dim)
                for z in (k, v))  # fmt: skip
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, -1)


def _compile(monkeypatch: pytest.MonkeyPatch, reads_groups: bool) -> tuple[object, Prefill, tuple]:
    """Compiled with the pass as if on CUDA, where ATen's attention reads grouped float32 heads with a
    mask (`reads_groups`) or does not."""
    facts = DeviceFacts((("float32", True),) if reads_groups else ())

    def on_cpu(program: Program, registry: KernelRegistry) -> Program:
        return relabel(read_grouped_heads(relabel(program, "cuda:0"), replace(registry, facts=facts)), "cpu")

    monkeypatch.setitem(passes.PASSES, "grouped_on_cpu", on_cpu)
    pipeline = [p for p in default_pipeline() if p != "grouped_attention"]
    pipeline.insert(pipeline.index("attention_masks"), "grouped_on_cpu")
    model, x = Prefill().eval(), torch.randn(2, 5, 128)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        return opgen.compile(model, (x, mask), passes=pipeline, cache=False), model, (x, mask)


def _forward(compiled: object) -> str:
    source = compiled.artifact.source  # type: ignore[attr-defined]
    return source.split("def forward(")[1].split("def forward_profiled")[0]


def test_the_attention_reads_the_heads_in_place_and_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, model, inputs = _compile(monkeypatch, reads_groups=True)
    forward = _forward(compiled)
    assert "enable_gqa=True" in forward and "clone" not in forward and "copy_(" not in forward, forward
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)  # type: ignore[operator]


def test_the_repeat_stays_where_aten_would_fall_back_to_its_math_path(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, model, inputs = _compile(monkeypatch, reads_groups=False)
    assert "enable_gqa" not in _forward(compiled)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)  # type: ignore[operator]


def test_cpu_programs_are_left_alone_and_a_machine_without_a_gpu_knows_no_grouped_kernel() -> None:
    model, x = Prefill().eval(), torch.randn(1, 4, 128)
    with torch.no_grad():
        compiled = opgen.compile(model, (x, torch.ones(4, 4, dtype=torch.bool)), cache=False)
    assert "enable_gqa" not in _forward(compiled)
    if not torch.cuda.is_available():
        assert device_facts() == DeviceFacts()
    else:  # on a GPU: only half-precision kernels read grouped heads, never float32's math path
        assert all(dtype in ("float16", "bfloat16") for dtype, _ in device_facts().grouped_attention)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_the_gpu_the_grouped_call_matches_eager(dtype: torch.dtype) -> None:
    model = Prefill().to("cuda", dtype).eval()
    x = torch.randn(2, 64, 128, device="cuda", dtype=dtype)
    mask = torch.ones(64, 64, dtype=torch.bool, device="cuda").tril()
    with torch.no_grad():
        compiled = opgen.compile(model, (x, mask), cache=False)
        torch.testing.assert_close(compiled(x, mask), model(x, mask), atol=2e-2, rtol=2e-2)  # type: ignore[operator]
    expected = (str(dtype).removeprefix("torch."), True) in device_facts().grouped_attention
    assert ("enable_gqa=True" in _forward(compiled)) == expected
