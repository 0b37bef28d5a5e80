"""Decoding with a static KV cache through `opgen.compile` (issue 18): graphs that write buffers.

A decode step writes the new key/value rows into cache tensors the model owns (`index_copy_`,
`index_put_`, `copy_` into a slice) at `cache_position`, a tensor input, so that one compiled
function serves every step. Each test runs a greedy decode in lockstep with eager on a copy of the
same model (both fed eager's tokens, so a mismatch is reported at the step it happens), then
compares the cache tensors: the compiled writes must land in the model's own tensors.

- transformers' export recipe (`TorchExportableModuleWithStaticCache` around a tiny Llama): its cache
  tensors live in a `StaticCache` object and are also registered as buffers, so torch.export lifts
  each twice, and `run_decompositions` used to fail on it (see `opgen.runtime.capture.lifted`).
- a gpt-fast-style model whose `KVCache` modules own registered buffers, in three write forms.
- a cache held by a plain object only (torch.export lifts it as a constant, which the graph writes).

GPU versions run the first two in plain and CUDA-graph mode; they are skipped without CUDA.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opgen
from opgen.bench.decode_models import HFStep  # the wrapper called with (ids, cache_position) by position
from opgen.runtime.capture.export import DecompositionError

STEPS = 20
MAX_LEN = 32
PROMPT = (3, 17, 42)  # fed one token per step (prefill by decode steps), then greedy

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def decode_in_lockstep(compiled: Callable[..., Any], eager: Callable[..., Any], device: str, atol: float) -> None:
    """Greedy decode of STEPS tokens; both sides get eager's tokens; logits and chosen tokens must match."""
    token = torch.tensor([[PROMPT[0]]], device=device)
    for step in range(STEPS):
        position = torch.tensor([step], device=device)
        got = compiled(token.clone(), position.clone())
        want = eager(token, position)
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")
        chosen, expected = got[0, -1].argmax().item(), want[0, -1].argmax().item()
        assert chosen == expected, f"step {step}: compiled picks token {chosen}, eager {expected}"
        following = PROMPT[step + 1] if step + 1 < len(PROMPT) else expected
        token = torch.tensor([[following]], device=device)


def assert_same_buffers(model: nn.Module, eager: nn.Module, atol: float) -> None:
    for (name, got), (_, want) in zip(model.named_buffers(), eager.named_buffers(), strict=True):
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4, msg=lambda m, n=name: f"buffer {n}: {m}")


def example(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([[PROMPT[0]]], device=device), torch.tensor([0], device=device)


# --- transformers: TorchExportableModuleWithStaticCache around a tiny Llama ---------------------------


def tiny_llama_steps(device: str) -> tuple[nn.Module, nn.Module]:
    """Two static-cache wrappers (to compile, and eager) of one tiny random Llama."""
    transformers = pytest.importorskip("transformers")
    executorch = pytest.importorskip("transformers.integrations.executorch")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config).eval().to(device)
    model.generation_config = transformers.GenerationConfig(use_cache=True, cache_implementation="static")

    def wrapped(m: nn.Module) -> nn.Module:
        cls = executorch.TorchExportableModuleWithStaticCache
        return HFStep(cls(m, batch_size=1, max_cache_len=MAX_LEN, device=torch.device(device)))

    return wrapped(model), wrapped(copy.deepcopy(model))


def run_llama(device: str, route: str, atol: float, **options: Any) -> Callable[..., Any]:
    step, eager = tiny_llama_steps(device)
    with torch.no_grad():
        # "function": a plain function over the wrapper, so export lifts the weights and caches as constants.
        target = step if route == "module" else (lambda ids, pos: step(ids, pos))
        compiled = opgen.compile(target, example(device), recompile=False, **options)
        decode_in_lockstep(compiled, eager, device, atol)
    assert_same_buffers(step, eager, atol)
    assert compiled.report().specializations == 1  # type: ignore[attr-defined]
    return compiled


@pytest.mark.parametrize("route", ["module", "function"])
def test_transformers_static_cache(route: str) -> None:
    compiled = run_llama("cpu", route, 1e-5)
    assert not compiled.report().fallbacks  # type: ignore[attr-defined]


# --- gpt-fast style: KVCache modules with registered buffers -------------------------------------------


class KVCache(nn.Module):
    def __init__(self, heads: int, head_dim: int, write: str) -> None:
        super().__init__()
        self.write = write
        batch = 2 if write == "slice_copy" else 1  # slice_copy: room for a larger batch than the one used
        self.register_buffer("k_cache", torch.zeros(batch, heads, MAX_LEN, head_dim))
        self.register_buffer("v_cache", torch.zeros(batch, heads, MAX_LEN, head_dim))

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.write == "index_put":  # gpt-fast
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v
            return self.k_cache, self.v_cache
        if self.write == "index_copy":  # transformers' StaticCache
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
            return self.k_cache, self.v_cache
        k_out, v_out = self.k_cache[: k.shape[0]], self.v_cache[: v.shape[0]]  # writes through slices
        k_out.index_copy_(2, pos, k)
        v_out.copy_(v_out.index_copy(2, pos, v))
        return k_out, v_out


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, write: str) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))
        self.cache = KVCache(heads, self.head_dim, write)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).split(d, -1)
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in qkv)
        k, v = self.cache.update(pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self, write: str, vocab: int = 128, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(MAX_LEN, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, write) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool)))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(pos)
        mask = self.causal[None, None, pos]
        for block in self.blocks:
            x = block(x, pos, mask)
        return self.head(x)  # type: ignore[no-any-return]


WRITES = ["index_put", "index_copy", "slice_copy"]


def run_decoder(write: str, device: str, atol: float, **options: Any) -> Callable[..., Any]:
    torch.manual_seed(0)
    model = TinyDecoder(write).eval().to(device)
    eager = copy.deepcopy(model)
    with torch.no_grad():
        compiled = opgen.compile(model, example(device), recompile=False, **options)
        decode_in_lockstep(compiled, eager, device, atol)
    assert_same_buffers(model, eager, atol)
    assert compiled.report().specializations == 1  # type: ignore[attr-defined]
    return compiled


@pytest.mark.parametrize("write", WRITES)
def test_gpt_fast_style_cache(write: str) -> None:
    compiled = run_decoder(write, "cpu", 1e-5)
    assert not compiled.report().fallbacks  # type: ignore[attr-defined]


# --- one function for every step ----------------------------------------------------------------------


def test_one_compiled_function_serves_every_step() -> None:
    """recompile=False: a step that needed a new specialization would raise; the cache sees every write."""
    torch.manual_seed(0)
    model = TinyDecoder("index_put").eval()
    with torch.no_grad():
        compiled = opgen.compile(model, example("cpu"), recompile=False)
        for step in range(MAX_LEN):
            compiled(torch.tensor([[step % 128]]), torch.tensor([step]))
    report = compiled.report()  # type: ignore[attr-defined]
    assert report.specializations == 1, report
    for block in model.blocks:
        assert block.cache.k_cache.abs().sum((0, 1, 3)).ne(0).all()  # every position written


# --- a cache no module owns ----------------------------------------------------------------------------


class _Cache:
    """Not a module: torch.export lifts its tensor as a constant, which the graph writes."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _OutsideCache(nn.Module):
    def __init__(self, view: bool = False) -> None:
        super().__init__()
        self.register_buffer("rows", torch.zeros(MAX_LEN, 8), persistent=False)
        self.held = _Cache(self.rows[:4] if view else torch.zeros(MAX_LEN, 8))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.held.tensor.index_copy_(0, pos, x)
        return self.held.tensor.sum(0)


def test_cache_held_outside_any_module() -> None:
    model = _OutsideCache()
    cache = model.held.tensor
    with torch.no_grad():
        compiled = opgen.compile(model, (torch.ones(1, 8), torch.tensor([0])), recompile=False)
        for step in range(4):
            out = compiled(torch.full((1, 8), step + 1.0), torch.tensor([step]))
    assert model.held.tensor is cache
    torch.testing.assert_close(cache[:4, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(out, torch.full((8,), 10.0))


def test_a_cache_viewing_a_buffer_is_an_opgen_error() -> None:
    """Inputs sharing memory without being one tensor: torch cannot retrace them; opgen says so, naming both."""
    with torch.no_grad(), pytest.raises(DecompositionError, match=r"_OutsideCache.*buffer 'rows' and constant"):
        opgen.compile(_OutsideCache(view=True), (torch.ones(1, 8), torch.tensor([0])))


# --- CUDA: plain and CUDA-graph mode -------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("graphs", [False, True], ids=["plain", "cuda_graphs"])
def test_transformers_static_cache_on_cuda(graphs: bool) -> None:
    compiled = run_llama("cuda", "module", 1e-4, cuda_graphs=graphs)
    if graphs:
        assert compiled.graph_status.captured, compiled.report()  # type: ignore[attr-defined]


@needs_cuda
@pytest.mark.parametrize("graphs", [False, True], ids=["plain", "cuda_graphs"])
@pytest.mark.parametrize("write", WRITES)
def test_gpt_fast_style_cache_on_cuda(write: str, graphs: bool) -> None:
    compiled = run_decoder(write, "cuda", 1e-4, cuda_graphs=graphs)
    if graphs:
        assert compiled.graph_status.captured, compiled.report()  # type: ignore[attr-defined]
