"""The `attention_rows` pass: the norms a decode attention's rotation reads (OLMo-2's q/k norms, over the whole
width of q and of k) computed by the attention itself, the row kernel's launch gone; what stays apart (a
LayerNorm, a norm per head, a norm read elsewhere); the ATen side; every config in Triton's interpreter; on a
GPU, plain and in CUDA-graph mode.

On the CPU the whole default pipeline runs as on CUDA (`fusion_interp.run_passes_as_if_cuda`), the kernels
bound to their ATen side, or run in Triton's interpreter and checked against it.
"""

from __future__ import annotations

import pytest
import torch
from fusion_interp import InterpretedBinding, ran_in_fresh_interpreter, run_passes_as_if_cuda
from test_decode_attention import cuda, interpreter, one_row_kernels
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.runtime import pipeline
from opgen.runtime.passes import DEFAULT_PIPELINE

MERGED = "the rows they read too"


class NormedRotaryAttention(nn.Module):
    """A decode step's attention after its projections, as OLMo-2's: q and k normalized over their whole
    width (RMSNorm, OLMo-2's form), viewed as heads, rotated, the step's key and value written into a static
    cache at `pos`, then SDPA. `norm`: "rms"; "written_layer" (a LayerNorm written out as means); "layer" (a
    LayerNorm's op: its rows' results are per element);
    "head" (an RMSNorm per head, as Qwen3's: rows of a head, not of the batch row). `returned`: the normed
    query is also returned (read after the attention)."""

    def __init__(self, heads: int = 4, kv_heads: int = 2, dim: int = 16, length: int = 40, batch: int = 1,
                 norm: str = "rms", returned: bool = False, dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.dim, self.norm, self.returned = heads, kv_heads, dim, norm, returned
        width = (dim,) * 2 if norm == "head" else (heads * dim, kv_heads * dim)
        self.q_weight = nn.Parameter(1 + 0.1 * torch.randn(width[0], dtype=dtype))
        self.k_weight = nn.Parameter(1 + 0.1 * torch.randn(width[1], dtype=dtype))
        self.register_buffer("k_cache", torch.randn(batch, kv_heads, length, dim, dtype=dtype))
        self.register_buffer("v_cache", torch.randn(batch, kv_heads, length, dim, dtype=dtype))
        self.register_buffer("causal", torch.tril(torch.ones(length, length, dtype=torch.bool)))
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))

    def _normed(self, x: torch.Tensor, weight: torch.Tensor, heads: int) -> torch.Tensor:
        b = x.shape[0]
        if self.norm == "layer":
            return F.layer_norm(x, (x.shape[-1],), weight)
        if self.norm == "written_layer":  # a LayerNorm written out: two reductions, the second of the first's result
            mean = x.mean(-1, keepdim=True)
            var = (x - mean).pow(2).mean(-1, keepdim=True)
            return (x - mean) * torch.rsqrt(var + 1e-5) * weight
        if self.norm == "head":
            x = x.view(b, 1, heads, self.dim)
        held = x.float()
        held = held * torch.rsqrt(held.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (weight * held).to(x.dtype).view(b, 1, heads * self.dim)  # OLMo-2's Olmo2RMSNorm

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> object:
        b = q.shape[0]
        normed_q = self._normed(q, self.q_weight, self.heads)
        qh = normed_q.view(b, 1, self.heads, self.dim).transpose(1, 2)
        kh = self._normed(k, self.k_weight, self.kv_heads).view(b, 1, self.kv_heads, self.dim).transpose(1, 2)
        angles = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(q.dtype)[None, None], emb.sin().to(q.dtype)[None, None]
        qh, kh = qh * cos + _rotate_half(qh) * sin, kh * cos + _rotate_half(kh) * sin
        self.k_cache.index_copy_(2, pos, kh)  # as transformers' static cache writes
        self.v_cache.index_copy_(2, pos, v)
        mask = self.causal[None, None, pos]
        out = F.scaled_dot_product_attention(qh, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        return (out, normed_q * 2) if self.returned else out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _inputs(model: NormedRotaryAttention, pos: int, batch: int = 1, device: str = "cpu") -> tuple:
    gen = torch.Generator().manual_seed(pos)
    dtype = model.q_weight.dtype
    q = torch.randn(batch, 1, model.heads * model.dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, 1, model.kv_heads * model.dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, model.kv_heads, 1, model.dim, generator=gen, dtype=dtype)
    return tuple(t.to(device) for t in (q, k, v, torch.tensor([pos])))


def _compiled(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple,
              bind: object = None) -> object:  # fmt: skip
    """The whole default pipeline as on CUDA; kernels bound to their ATen side (or by `bind`)."""
    from opgen.runtime.execution import fused as fused_module

    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    aten = lambda found: {s.local: (lambda call: call) for s in found}  # noqa: E731
    monkeypatch.setattr(fused_module, "bindings", bind or aten)
    with torch.no_grad():
        return opgen.compile(model, example, passes=DEFAULT_PIPELINE, cache=False)


def _steps(compiled: object, model: NormedRotaryAttention, eager: NormedRotaryAttention, batch: int,
           positions: tuple[int, ...], tolerance: float = 2e-5) -> None:  # fmt: skip
    for pos in positions:
        example = _inputs(model, pos, batch)
        with torch.no_grad():
            want, got = eager(*example), compiled(*example)  # type: ignore[operator]
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def _pair(batch: int = 1, **kw: object) -> tuple[NormedRotaryAttention, NormedRotaryAttention]:
    torch.manual_seed(0)
    model = NormedRotaryAttention(batch=batch, **kw)  # type: ignore[arg-type]
    eager = NormedRotaryAttention(batch=batch, **kw)  # type: ignore[arg-type]
    eager.load_state_dict(model.state_dict())
    return model, eager


@pytest.mark.parametrize(("kernel", "norm"), [("row", "rms"), ("group", "rms"), ("group", "written_layer")])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_norms_are_the_attentions_and_the_aten_side_matches(monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                               norm: str, batch: int) -> None:  # fmt: skip
    if kernel == "row":
        one_row_kernels(monkeypatch)
    model, eager = _pair(batch, norm=norm)
    compiled = _compiled(monkeypatch, model, _inputs(model, 0, batch))
    jit = compiled.report().jit  # type: ignore[attr-defined]
    (attention,) = [line for line in jit if "decode attention" in line]
    assert "its query and keys computed first" in attention and MERGED in attention, jit
    assert not [line for line in jit if "row kernel" in line and "decode attention" not in line], jit  # no launch
    (spec,) = [s for s in compiled.artifact.fused if s.local.startswith("attention")]  # type: ignore[attr-defined]
    assert {"q", "k", "p_q_weight", "p_k_weight"} <= set(spec.inputs), spec.inputs  # the norms' inputs, not their views
    assert "_query_stats0" in spec.source and "_key_stats0" in spec.source, spec.source
    _steps(compiled, model, eager, batch, (0, 1, 17, 39))


@pytest.mark.parametrize(
    ("kw", "why"),
    [({"norm": "layer"}, "a LayerNorm's result is one value an element"),
     ({"norm": "head"}, "a norm per head (Qwen3's): its rows are not the batch rows"),
     ({"returned": True}, "the normed query is read after the attention too")],
)  # fmt: skip
def test_what_stays_a_row_kernel(monkeypatch: pytest.MonkeyPatch, kw: dict, why: str) -> None:
    model, eager = _pair(**kw)
    compiled = _compiled(monkeypatch, model, _inputs(model, 0))
    jit = compiled.report().jit  # type: ignore[attr-defined]
    (attention,) = [line for line in jit if "decode attention" in line]
    assert MERGED not in attention and "mean" not in attention and "layer_norm" not in attention, (why, jit)
    for pos in (0, 5):
        example = _inputs(model, pos)
        with torch.no_grad():
            want, got = eager(*example), compiled(*example)  # type: ignore[operator]
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_the_pass_is_in_the_default_pipeline_after_the_rotations() -> None:
    order = list(DEFAULT_PIPELINE)
    assert order.index("attention_prologue") < order.index("attention_rows") < order.index("dependent_launch")


@interpreter
@pytest.mark.parametrize(
    ("kernel", "batch", "dtype", "norm"),
    [("row", 1, "float32", "rms"), ("group", 3, "float32", "rms"), ("group", 1, "float16", "rms"),
     ("row", 2, "float16", "rms"), ("group", 2, "float32", "written_layer")],
)  # fmt: skip
def test_every_config_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                         kernel: str, batch: int, dtype: str, norm: str) -> None:  # fmt: skip
    """Each config of the merged kernel against its ATen side, the caches it wrote read at later positions."""
    if ran_in_fresh_interpreter(request):
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if kernel == "row":
        one_row_kernels(monkeypatch)
    checks: list[str] = []
    tolerance = 2e-5 if dtype == "float32" else 2e-3
    bind = lambda found: {  # noqa: E731
        s.local: InterpretedBinding(s, checks, {"atol": tolerance, "rtol": tolerance}) for s in found
    }
    model, eager = _pair(batch, norm=norm, dtype=getattr(torch, dtype))
    compiled = _compiled(monkeypatch, model, _inputs(model, 0, batch), bind)
    assert any(MERGED in line for line in compiled.report().jit)  # type: ignore[attr-defined]
    _steps(compiled, model, eager, batch, (0, 1, 17), tolerance)
    assert any(c.startswith("attention") for c in checks), checks


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_gpu_plain_and_in_graph_mode(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    from opgen.jit.env import available

    if not available():
        pytest.skip("needs opgen's JIT (a CUDA build and triton)")
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    for graphs in (False, True):
        for batch in (1, 4):
            model, eager = (m.cuda() for m in _pair(batch, heads=16, kv_heads=16, dim=128, length=300, dtype=dtype))
            with torch.no_grad():
                compiled = opgen.compile(model, _inputs(model, 0, batch, "cuda"), cuda_graphs=graphs, cache=False)
                assert any(MERGED in line for line in compiled.report().jit), compiled.report()
                for pos in (0, 1, 150, 299):
                    example = _inputs(model, pos, batch, "cuda")
                    want, got = eager(*example), compiled(*example)
                    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
