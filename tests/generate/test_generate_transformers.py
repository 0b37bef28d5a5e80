"""transformers' generate() through opgen, both ways its docs show, on tiny random models of five families.

- `compile_config=CompileConfig(backend="opgen", mode=None, options=...)`: transformers compiles the
  decode steps itself (`mode=None`: torch.compile takes a mode or options, not both).
- `model.forward = torch.compile(model.forward, backend="opgen")`: prefill and decode compiled.

Static cache; greedy at batch 1 and 2 (left-padded prompts of different lengths, with their
attention mask), and sampled with a seed: tokens equal eager generate()'s in float32. On a GPU the
decode steps replay CUDA graphs (`cuda_graphs=True`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from opgen.bench.llm_families import causal_lm

transformers = pytest.importorskip("transformers")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FAMILIES = ["llama", "qwen2", "mistral", "gemma", "phi3"]
OPTIONS = {"cuda_graphs": DEVICE == "cuda"}


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def settings(path: str) -> dict[str, Any]:
    base: dict[str, Any] = {"max_new_tokens": 8, "cache_implementation": "static", "pad_token_id": 0}
    if path == "compile_config":
        config = transformers.CompileConfig(backend="opgen", mode=None, options=OPTIONS)
        config._compile_all_devices = True  # transformers compiles on a CPU only when told to
        return {**base, "compile_config": config}
    return {**base, "disable_compile": True}


def through_opgen(model: torch.nn.Module, path: str) -> None:
    if path == "forward":
        model.forward = torch.compile(model.forward, backend="opgen", options=OPTIONS)


BATCHES = {
    "one": (torch.tensor([[1, 5, 7, 9, 11]]), torch.ones(1, 5, dtype=torch.long)),
    "ragged": (torch.tensor([[1, 5, 7, 9, 11], [0, 0, 3, 4, 8]]), torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])),
}


@pytest.mark.parametrize("path", ["compile_config", "forward"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generate_through_opgen_gives_eager_tokens(family: str, path: str) -> None:
    model = causal_lm(family, device=DEVICE)
    with torch.no_grad():
        eager = {k: model.generate(ids.to(DEVICE), attention_mask=mask.to(DEVICE), do_sample=False,
                                   **settings("eager")) for k, (ids, mask) in BATCHES.items()}  # fmt: skip
        through_opgen(model, path)
        for key, (ids, mask) in BATCHES.items():
            got = model.generate(ids.to(DEVICE), attention_mask=mask.to(DEVICE), do_sample=False, **settings(path))
            assert got.tolist() == eager[key].tolist(), key


@pytest.mark.parametrize("path", ["compile_config", "forward"])
def test_sampled_generate_through_opgen_repeats_with_a_seed_and_equals_eager(path: str) -> None:
    model = causal_lm("llama", device=DEVICE)
    ids, mask = (t.to(DEVICE) for t in BATCHES["ragged"])
    sample = {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 0.95}

    def run(how: str) -> list[list[int]]:
        torch.manual_seed(123)
        return model.generate(ids, attention_mask=mask, **sample, **settings(how)).tolist()  # type: ignore[no-any-return]

    with torch.no_grad():
        eager = run("eager")
        through_opgen(model, path)
        first = run(path)
        assert run(path) == first
    assert first == eager


def test_generate_with_new_lengths_of_cache_replays_a_graph_a_length() -> None:
    """A longer max_new_tokens makes a static cache of another length (transformers keeps the largest it
    made), and Dynamo then compiles the decode step with a symbolic cache length: tokens stay eager's, and
    on a GPU that dynamic graph replays a CUDA graph for each length (`execution.size_graphs`) instead of
    running plain."""
    from opgen.bench import graph_notes

    reference, model = causal_lm("llama", device=DEVICE), causal_lm("llama", device=DEVICE)  # a cache each
    ids, mask = (t.to(DEVICE) for t in BATCHES["one"])
    news = (4, 8, 12, 8)  # caches of 9, 13 and 17 positions; the last call reuses 17
    with torch.no_grad():
        eager = [reference.generate(ids, attention_mask=mask, do_sample=False,
                                    **{**settings("eager"), "max_new_tokens": n}) for n in news]  # fmt: skip
        through_opgen(model, "forward")
        with graph_notes.collecting() as made:
            for n, expected in zip(news, eager, strict=True):
                got = model.generate(
                    ids, attention_mask=mask, do_sample=False, **{**settings("forward"), "max_new_tokens": n}
                )
                assert got.tolist() == expected.tolist(), n
    lines = [str(fn.report().cuda_graph) for fn in made]
    if DEVICE == "cuda":
        dynamic = [line for line in lines if "one graph a set of sizes" in line]
        found = re.search(r"(\d+) captured .*\((\d+) replays", dynamic[-1]) if dynamic else None
        assert found and int(found[1]) == 2 and int(found[2]) >= 15, lines
