"""torch.compile(backend="opgen") keeps the graph's writes to its inputs in the graph.

AOT autograd is asked to keep input mutations in the graph (`keep_inference_input_mutations`, as
Inductor asks): the writes reach opgen as `copy_` into the input, which opgen's passes turn into
in-place kernels on the buffer itself. Nothing is copied back per call: before, the graph returned
each written buffer anew and AOT's wrapper copied it into the module on every call (a decode step's
whole KV cache, twice a token).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import profile

BACKENDS = ["python", "cpp"]


class CacheWrite(nn.Module):
    """A decode step's cache write: a projection written into a buffer at a position, then read."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 4, 32, 8))
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(2, pos, self.proj(x))
        return self.cache.sum(2)


class ManyWrites(nn.Module):
    """Every kind of write: a buffer at a position, a whole buffer, a slice of one, a view of one, an input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 4, 32, 8))
        self.register_buffer("count", torch.zeros(4))
        self.register_buffer("scale", torch.ones(8))
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.index_copy_(2, pos, self.proj(x))
        self.count.add_(1)
        self.scale[2:5] = y[:3]
        y.mul_(2)
        self.cache[:, :, :4].add_(0.5)
        return self.cache.sum(2) + self.count.sum() + self.scale.sum(), y + 1


def _twins(make: type[nn.Module], device: str = "cpu") -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = make().eval().to(device)
    eager = make().eval().to(device)
    eager.load_state_dict(model.state_dict())
    return model, eager


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kind_of_write_matches_eager(backend: str) -> None:
    torch._dynamo.reset()
    model, eager = _twins(ManyWrites)
    with torch.no_grad():
        compiled = torch.compile(model, backend="opgen", options={"backend": backend})
        for position in (3, 7, 1, 7):
            x, y = torch.randn(1, 4, 1, 8), torch.randn(8)
            y_eager = y.clone()
            got, want = compiled(x, torch.tensor([position]), y), eager(x, torch.tensor([position]), y_eager)
            for a, b in zip([*got, y, *model.buffers()], [*want, y_eager, *eager.buffers()], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _copies_of(shape: tuple[int, ...], run: object, calls: int) -> int:
    """How many `aten::copy_` calls with a tensor of `shape` happen in `calls` calls of `run`."""
    with profile(record_shapes=True) as prof:
        for _ in range(calls):
            run()  # type: ignore[operator]
    return sum(1 for e in prof.events() if e.name == "aten::copy_" and list(shape) in e.input_shapes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_written_buffer_is_written_in_place_and_never_copied(backend: str) -> None:
    torch._dynamo.reset()
    model, eager = _twins(CacheWrite)
    address = model.cache.data_ptr()
    x, pos = torch.randn(1, 4, 1, 8), torch.tensor([5])
    with torch.no_grad():
        compiled = torch.compile(model, backend="opgen", options={"backend": backend})
        torch.testing.assert_close(compiled(x, pos), eager(x, pos))
        assert _copies_of(tuple(model.cache.shape), lambda: compiled(x, pos), calls=3) == 0
    assert model.cache.data_ptr() == address
    torch.testing.assert_close(model.cache, eager.cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_in_cuda_graph_mode_a_written_buffer_is_not_copied() -> None:
    torch._dynamo.reset()
    model, eager = _twins(CacheWrite, "cuda")
    x = torch.randn(1, 4, 1, 8, device="cuda")
    with torch.no_grad():
        compiled = torch.compile(model, backend="opgen", options={"cuda_graphs": True})
        for position in (1, 2, 3):
            pos = torch.tensor([position], device="cuda")
            torch.testing.assert_close(compiled(x, pos), eager(x, pos))
        pos = torch.tensor([4], device="cuda")
        assert _copies_of(tuple(model.cache.shape), lambda: compiled(x, pos), calls=3) == 0
        eager(x, pos)
    torch.cuda.synchronize()
    torch.testing.assert_close(model.cache, eager.cache)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])  # fmt: skip
def test_generate_through_the_backend_copies_no_cache_buffer_per_token(device: str) -> None:
    """transformers' generate() with a static cache, `model.forward` compiled by the backend: the tokens are
    eager's, and no step copies a cache buffer (before: every layer's keys and values, every token)."""
    pytest.importorskip("transformers")
    from opgen.bench.llm_families import causal_lm

    model = causal_lm("llama", "tiny", device=device)
    config = model.config
    ids = torch.tensor([[1, 5, 7, 9]], device=device)
    settings = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": "static", "disable_compile": True}
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model.generate(ids, **settings)
        model.forward = torch.compile(model.forward, backend="opgen")
        assert model.generate(ids, **settings).tolist() == expected.tolist()  # compiles prefill and decode
        length = ids.shape[1] + settings["max_new_tokens"] - 1  # the last token is never fed back
        heads, head = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
        cache_shape = (1, heads, length, head)  # batch, key/value heads, positions, head size
        with profile(record_shapes=True) as prof:
            assert model.generate(ids, **settings).tolist() == expected.tolist()
    copies = [e for e in prof.events() if e.name == "aten::copy_" and list(cache_shape) in e.input_shapes]
    # One per buffer and generate() call, however many tokens: the cache's own set-up, outside the
    # compiled steps (before: 60 for these 8 tokens, each step copying every written buffer back).
    assert len(copies) <= 2 * config.num_hidden_layers
