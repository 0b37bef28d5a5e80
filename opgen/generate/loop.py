"""opgen's generation loop: prompts in, tokens out, at the speed of the compiled decode step.

A `Generator` compiles, per batch size, functions of one `CachedLM` (they share its KV cache): the
prefill, one graph for every prompt length up to the cache (a dynamic length, compiled with
`recompile=False`, so no length ever recompiles); on a GPU a prefill chunk of fixed length, which
runs prompts as whole chunks replayed as a CUDA graph (prefill.py); and the decode step (one token
per row, replayed as a CUDA graph on a GPU). Per token the host launches the step and the sampler (sampling.py) and
queues a copy of the tokens (landing.py); it reads tokens only once their copy has landed, so it
never waits on the GPU, and stops the loop when every row has produced a stop token.

Prompts of different lengths are left-padded; each row decodes at its own position (step.py).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from opgen.generate.errors import GenerationError
from opgen.generate.landing import Landing
from opgen.generate.prefill import Prefill
from opgen.generate.sampling import GREEDY, Sampler, Sampling
from opgen.generate.step import CachedLM, check_model

COMPILERS = ("opgen", "inductor", "eager")
EOS = object()  # stop at the model's end-of-sequence tokens (its generation_config)


@dataclass(frozen=True, slots=True)
class StepTokens:
    """The tokens of one step, per row; None for a row that had already stopped."""

    step: int
    tokens: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class Generation:
    """Each row's new tokens (up to and including its stop token), and where the time went."""

    tokens: list[list[int]]
    prefill_s: float  # the prompt's graph and the first token
    decode_s: float  # every later step, until the last row stopped or max_new_tokens
    steps: int  # decode steps run after the prefill

    @property
    def decode_ms_per_step(self) -> float:
        return 1e3 * self.decode_s / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens of all rows per second, prefill included."""
        total = self.prefill_s + self.decode_s
        return sum(map(len, self.tokens)) / total if total else 0.0


@dataclass
class Steps:
    """One batch size's compiled functions over one cache: prefill (any length) and the decode step."""

    module: CachedLM
    prefill: Callable[..., torch.Tensor]  # any prompt length (dynamic)
    decode: Callable[..., torch.Tensor]
    compile_s: float = 0.0
    chunk: Callable[..., torch.Tensor] | None = None  # prompts of `chunk_size` tokens (static), if compiled
    chunk_size: int = 0

    @property
    def prompt(self) -> Prefill:
        """The prompt's pass: whole chunks where the padded prompt fits the cache, else the dynamic prefill."""
        return Prefill(self.prefill, self.chunk, self.chunk_size)


@dataclass
class Generator:
    """Generation with `model` (a transformers causal LM), compiled by `compiler` on first use per batch size.

    max_cache: positions per row of the KV cache (prompt + new tokens); default the model's
        max_position_embeddings, at most 2048.
    compiler: "opgen" (default), "inductor" (torch.compile: dynamic prefill, decode in
        mode="reduce-overhead" on a GPU; a gpt-fast-style loop) or "eager".
    cuda_graphs: replay the decode step as a CUDA graph (default: on a GPU).
    backend: opgen.compile's backend ("auto", "cpp", "python").
    prefill_chunk: run prompts as chunks of this many tokens through one graph compiled for that length
        (replayed as a CUDA graph with cuda_graphs), left-padded to whole chunks where that fits the cache
        (prefill.py); 0 runs every prompt through the dynamic prefill. Default: 256 (at most max_cache)
        with compiler="opgen" and CUDA graphs, else 0.
    """

    model: nn.Module
    max_cache: int | None = None
    compiler: str = "opgen"
    cuda_graphs: bool | None = None
    backend: str = "auto"
    prefill_chunk: int | None = None
    _steps: dict[int, Steps] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_model(self.model)
        if self.compiler not in COMPILERS:
            raise GenerationError(f"compiler {self.compiler!r}: one of {', '.join(COMPILERS)}")
        config = self.model.config.get_text_config()  # type: ignore[union-attr, operator]
        self.vocab = int(config.vocab_size)
        self.device = next(self.model.parameters()).device
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048
        if self.max_cache is None:
            self.max_cache = min(int(limit), 2048)
        if not isinstance(self.max_cache, int) or self.max_cache < 2:
            raise GenerationError(f"max_cache must be an int >= 2, got {self.max_cache!r}")
        if self.cuda_graphs is None:
            self.cuda_graphs = self.device.type == "cuda"
        if self.prefill_chunk is None:
            self.prefill_chunk = min(256, self.max_cache) if self.cuda_graphs and self.compiler == "opgen" else 0
        chunk = self.prefill_chunk
        if not isinstance(chunk, int) or isinstance(chunk, bool) or not 0 <= chunk <= self.max_cache:
            raise GenerationError(f"prefill_chunk must be an int in [0, max_cache={self.max_cache}], got {chunk!r}")
        if chunk and self.compiler != "opgen":
            raise GenerationError(f"prefill_chunk is opgen's (compiler='opgen'), not compiler={self.compiler!r}'s")
        eos = self.model.generation_config.eos_token_id  # type: ignore[union-attr]
        self.eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))

    def __call__(self, prompts: Any, max_new_tokens: int, sampling: Sampling = GREEDY, stop_tokens: Any = EOS,
                 on_tokens: Callable[[StepTokens], None] | None = None) -> Generation:  # fmt: skip
        """Generate for `prompts` (token ids: one list, a list of lists of any lengths, or a tensor [B, T])."""
        run = _Run(self, prompts, max_new_tokens, sampling, stop_tokens)
        for step in run.steps():
            if on_tokens is not None:
                on_tokens(step)
        return run.result()

    def stream(self, prompts: Any, max_new_tokens: int, sampling: Sampling = GREEDY,
               stop_tokens: Any = EOS) -> Iterator[StepTokens]:  # fmt: skip
        """The tokens of each step, as they reach the host (validated before the first is made)."""
        return _Run(self, prompts, max_new_tokens, sampling, stop_tokens).steps()

    def steps(self, batch: int) -> Steps:
        """The compiled prefill and decode step for `batch` rows (compiled on first use)."""
        if batch not in self._steps:
            self._steps[batch] = self._compile(batch)
        return self._steps[batch]

    def _compile(self, batch: int) -> Steps:
        import opgen

        start = time.perf_counter()
        assert self.max_cache is not None
        module = CachedLM(self.model, batch, self.max_cache).eval()
        device = self.device
        length = min(8, self.max_cache)
        ids = torch.zeros((batch, length), dtype=torch.long, device=device)
        pos = torch.zeros(1, dtype=torch.long, device=device)
        offsets = torch.zeros(batch, dtype=torch.long, device=device)
        one = torch.zeros((batch, 1), dtype=torch.long, device=device)
        chunk = None
        with torch.no_grad():
            if self.compiler == "opgen":
                dim = torch.export.Dim("prompt", min=1, max=self.max_cache)
                prefill = opgen.compile(module, (ids, pos, offsets), dynamic_shapes=({1: dim}, None, None),
                                        recompile=False, backend=self.backend)  # fmt: skip
                graphs = bool(self.cuda_graphs)  # the fixed-length functions: replayed as CUDA graphs
                static = functools.partial(opgen.compile, module, cuda_graphs=graphs, static_outputs=graphs,
                                           recompile=False, backend=self.backend)  # fmt: skip
                decode = static((one, pos, offsets))
                if self.prefill_chunk:
                    block = torch.zeros((batch, self.prefill_chunk), dtype=torch.long, device=device)
                    chunk = static((block, pos, offsets))
            elif self.compiler == "inductor":
                prefill = torch.compile(module, dynamic=True, fullgraph=True)
                mode = "reduce-overhead" if self.cuda_graphs else None
                decode = torch.compile(module, mode=mode, fullgraph=True, dynamic=False)
            else:
                prefill = decode = module
        return Steps(module, prefill, decode, time.perf_counter() - start, chunk, self.prefill_chunk or 0)


class _Run:
    """One call of the loop: validated inputs, then the steps as a generator of StepTokens."""

    def __init__(self, gen: Generator, prompts: Any, max_new_tokens: int, sampling: Sampling, stop: Any) -> None:
        self.gen = gen
        self.rows = _prompt_rows(prompts, gen.vocab)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        longest = max(map(len, self.rows))
        assert gen.max_cache is not None
        if longest + max_new_tokens > gen.max_cache:
            raise GenerationError(
                f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} needs {longest + max_new_tokens} "
                f"cache positions; the cache has {gen.max_cache} (Generator(max_cache=...))"
            )
        if not isinstance(sampling, Sampling):
            raise GenerationError(f"sampling must be an opgen.generate.Sampling, got {type(sampling).__name__}")
        self.max_new_tokens, self.sampling = max_new_tokens, sampling
        self.stop = frozenset(gen.eos if stop is EOS else _token_list(stop, "stop_tokens", gen.vocab))
        self.tokens: list[list[int]] = [[] for _ in self.rows]
        self.prefill_s = self.decode_s = 0.0
        self.decode_steps = 0
        self.done = False

    def steps(self) -> Iterator[StepTokens]:
        gen, rows = self.gen, self.rows
        device, batch = gen.device, len(rows)
        steps = gen.steps(batch)
        prompt = steps.prompt
        assert gen.max_cache is not None
        longest = prompt.padded(max(map(len, rows)), self.max_new_tokens, gen.max_cache)  # left-padded to it
        ids = torch.tensor([[0] * (longest - len(r)) + r for r in rows], dtype=torch.long).to(device)
        offsets = torch.tensor([longest - len(r) for r in rows], dtype=torch.long).to(device)
        start = torch.zeros(1, dtype=torch.long, device=device)
        sampler = Sampler(self.sampling, device)
        landing = Landing(batch, device)
        stopped = [False] * batch
        clock = _Clock(device)
        with torch.no_grad():
            token = sampler(prompt(ids, start, offsets))
            clock.mark()
            start.fill_(longest)
            for i in range(self.max_new_tokens):
                if i:
                    token = sampler(steps.decode(token[:, None], start, offsets))
                    start.add_(1)
                    self.decode_steps += 1
                for step, values in itertools.chain(landing.push(i, token), landing.landed()):
                    yield self._land(step, values, stopped)
                if all(stopped):
                    break
            for step, values in landing.drain():
                if not all(stopped):
                    yield self._land(step, values, stopped)
        clock.mark()
        self.prefill_s, self.decode_s = clock.spans()
        self.done = True

    def _land(self, step: int, values: list[int], stopped: list[bool]) -> StepTokens:
        out: list[int | None] = []
        for row, value in enumerate(values):
            if stopped[row]:
                out.append(None)
                continue
            self.tokens[row].append(value)
            out.append(value)
            stopped[row] = value in self.stop
        return StepTokens(step, tuple(out))

    def result(self) -> Generation:
        assert self.done
        return Generation(self.tokens, self.prefill_s, self.decode_s, self.decode_steps)


class _Clock:
    """Times of the loop's phases without a sync between them: CUDA events on a GPU, the host clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]


def _prompt_rows(prompts: Any, vocab: int) -> list[list[int]]:
    """Prompts as lists of ints, checked: one prompt, a batch of them, or a tensor [T] / [B, T]."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2) or prompts.dtype.is_floating_point or prompts.dtype == torch.bool:
            raise GenerationError(f"prompts as a tensor must be integer token ids [T] or [B, T], got "
                                  f"{prompts.dtype} {list(prompts.shape)}")  # fmt: skip
        prompts = prompts.tolist()
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise GenerationError(f"prompts must be token ids (a list of ints, a list of such lists or a tensor), got "
                              f"{type(prompts).__name__}")  # fmt: skip
    if len(prompts) == 0:
        raise GenerationError("no prompts: give at least one prompt of at least one token")
    batch = [prompts] if not isinstance(prompts[0], (Sequence, torch.Tensor)) else list(prompts)
    rows = []
    for i, row in enumerate(batch):
        row = row.tolist() if isinstance(row, torch.Tensor) else row
        if not isinstance(row, Sequence) or len(row) == 0:
            raise GenerationError(f"prompt {i} is empty: a prompt needs at least one token")
        rows.append(_token_list(row, f"prompt {i}", vocab))
    return rows


def _token_list(values: Any, what: str, vocab: int) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < vocab:
            raise GenerationError(f"{what}: token ids are ints in [0, {vocab}) (the model's vocabulary), got {v!r}")
    return values
