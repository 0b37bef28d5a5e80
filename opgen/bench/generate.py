"""`python -m opgen.bench generate`: text generation end to end, from prompt to tokens, five ways.

Model: a transformers causal LM from `opgen.bench.llm_families` (default Llama-3.2-1B's shape on CUDA,
tiny on CPU; random weights, nothing downloaded), static KV cache, greedy. Cases: prompt lengths
(`--prompts`, default 32 and 512) x batch sizes (`--batches`, default 1 and 8), `--new` tokens each
(default 128; no stop token, so every run makes them all). Rows:

- `eager`: transformers' `generate()`, `disable_compile=True`.
- `hf_inductor`: `generate()` with transformers' own compile (its default `CompileConfig`: Inductor,
  mode="reduce-overhead", decode steps only).
- `hf_opgen_config`: `generate(compile_config=CompileConfig(backend="opgen", mode=None,
  options={"cuda_graphs": ...}))`.
- `hf_opgen_forward`: `model.forward = torch.compile(model.forward, backend="opgen", options=...)`.
- `loop_inductor`: opgen's loop with `compiler="inductor"` (a gpt-fast-style loop: prefill
  `torch.compile(dynamic=True)`, decode steps in mode="reduce-overhead").
- `opgen_loop`: opgen's own loop (`opgen.generate.Generator`; on a GPU prompts run as chunks of 256
  replayed as a CUDA graph, `opgen.generate.prefill`).
- `hf_floor`: transformers' `generate()` with a forward that computes nothing (it returns fixed logits):
  the time its own loop takes per token, the floor under every `generate()` row.

Per row and case, wall time (host clock, synchronized) of a generation of 1 token (the prefill) and
of `--new` tokens, median over `--repeats` after a first call that compiles: prefill ms = the
1-token time, decode ms/token = (t(new) - t(1)) / (new - 1), tokens/s = batch x new / t(new).
"tokens == eager" counts the leading greedy tokens equal to eager's (bf16 rounding lets them part).
For the loops, teacher-forced logits (eager's greedy tokens fed) against eager's step, as a
fraction of eager's largest logit, so opgen's rounding error sits beside Inductor's. And opgen's
compiled decode step replayed back to back, the floor the loop's decode is measured against. The
backend rows' note says how each graph the backend compiled ran: its replays and plain calls, or why
it runs plain, and whether it holds opgen's decode-attention kernel (`graph_notes`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

import opgen  # noqa: F401  (registers the "opgen" torch.compile backend)
from opgen.bench import graph_notes
from opgen.bench.decode import reason
from opgen.bench.llm_families import FAMILIES, causal_lm
from opgen.bench.timing import copy_bandwidth, device_sync, format_table
from opgen.generate import Generator, Steps

LABELS = {
    "eager": "eager generate()",
    "hf_inductor": "generate(), transformers' compile (Inductor)",
    "hf_opgen_config": 'generate(compile_config=CompileConfig(backend="opgen"))',
    "hf_opgen_forward": 'generate(), forward = torch.compile(backend="opgen")',
    "loop_inductor": "gpt-fast-style loop, Inductor reduce-overhead",
    "opgen_loop": "opgen.generate loop",
    "hf_floor": "generate(), a forward that computes nothing (its loop alone)",
}
ROWS = tuple(LABELS)  # the paths, in the order they run
Run = Callable[[torch.Tensor, int], list[list[int]]]  # (prompt ids [B, P], new tokens) -> tokens per row


@dataclass(frozen=True, slots=True)
class Result:
    row: str
    prompt: int
    batch: int
    first_call_s: float | None
    prefill_ms: float | None
    decode_ms: float | None
    tokens_per_s: float | None
    equal_tokens: int | None
    logit_err: float | None = None  # teacher-forced, / max |eager logit|; loops only
    step_ms: float | None = None  # the compiled decode step back to back, halfway through the decode; opgen's loop only
    error: str = ""
    note: str = ""  # the backend rows: how each compiled graph ran (`graph_notes`)


def hf_runner(row: str, model: torch.nn.Module, cuda: bool) -> tuple[Run, Callable[[], None]]:
    """transformers' generate() the row's way, and what undoes it."""
    from transformers import CompileConfig

    settings: dict[str, Any] = {"do_sample": False, "cache_implementation": "static", "pad_token_id": 0}
    original = model.forward
    options = {"cuda_graphs": cuda}
    if row == "eager":
        settings["disable_compile"] = True
    elif row == "hf_inductor":
        settings["compile_config"] = CompileConfig()
        settings["compile_config"]._compile_all_devices = True  # on a CPU too, as on CUDA by default
    elif row == "hf_opgen_config":
        settings["compile_config"] = CompileConfig(backend="opgen", mode=None, options=options)
        settings["compile_config"]._compile_all_devices = True
    elif row == "hf_opgen_forward":
        settings["disable_compile"] = True
        model.forward = torch.compile(model.forward, backend="opgen", options=options)
    elif row == "hf_floor":
        settings["disable_compile"] = True
        model.forward = _fixed_logits(model)

    def run(ids: torch.Tensor, new: int) -> list[list[int]]:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             **settings)  # fmt: skip
        return out[:, ids.shape[1] :].tolist()  # type: ignore[no-any-return]

    def undo() -> None:
        model.forward = original
        for attr in ("_compiled_call", "_last_compile_config"):
            if attr in model.__dict__:
                delattr(model, attr)
        torch._dynamo.reset()

    return run, undo


def _fixed_logits(model: torch.nn.Module) -> Callable[..., Any]:
    """A forward for generate() that computes nothing: the same logits every call, the cache passed through."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    param = next(model.parameters())
    vocab = model.config.get_text_config().vocab_size  # type: ignore[operator, union-attr]
    outputs: dict[int, Any] = {}

    def forward(input_ids: torch.Tensor, **kwargs: Any) -> Any:
        batch = input_ids.shape[0]
        if batch not in outputs:
            outputs[batch] = torch.zeros(batch, 1, vocab, device=param.device, dtype=param.dtype)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        return CausalLMOutputWithPast(logits=outputs[batch], past_key_values=cache)

    return forward


def loop_runner(gen: Generator) -> Run:
    return lambda ids, new: gen(ids, new, stop_tokens=()).tokens


def timed(run: Run, ids: torch.Tensor, new: int, sync: Callable[[], None]) -> tuple[float, list[list[int]]]:
    sync()
    start = time.perf_counter()
    tokens = run(ids, new)
    sync()
    return time.perf_counter() - start, tokens


def forced_logits(steps: Steps, ids: torch.Tensor, tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Each step's logits [B, V] (float32, CPU) with `tokens` fed: the prefill, then one per token but the last."""
    device = ids.device
    zero, offsets = torch.zeros(1, dtype=torch.long, device=device), torch.zeros(ids.shape[0], dtype=torch.long,
                                                                                    device=device)  # fmt: skip
    out = [steps.prefill(ids, zero, offsets).float().cpu()]
    for i in range(len(tokens[0]) - 1):
        pos = torch.tensor([ids.shape[1] + i], dtype=torch.long, device=device)
        fed = torch.tensor([[row[i]] for row in tokens], dtype=torch.long, device=device)  # [B, 1], strides (1, 1)
        out.append(steps.decode(fed, pos, offsets).float().cpu())
    return out


def step_time(steps: Steps, batch: int, calls: int, device: torch.device, position: int) -> float:
    """ms per call of the compiled decode step at a cache `position` (its keys before it kept), back to
    back (one sync at the end), median of 5."""
    ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
    pos = torch.tensor([position], dtype=torch.long, device=device)
    offsets = torch.zeros(batch, dtype=torch.long, device=device)
    sync = device_sync(device)
    samples = []
    for _ in range(6):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            steps.decode(ids, pos, offsets)
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples[1:])


def run_case(rows: Sequence[str], model: torch.nn.Module, loops: dict[str, Generator], prompt: int, batch: int,
             new: int, repeats: int, device: torch.device) -> list[Result]:  # fmt: skip
    cuda = device.type == "cuda"
    sync = device_sync(device)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(1, vocab, (batch, prompt), generator=torch.Generator().manual_seed(prompt + batch)).to(device)
    reference: list[list[int]] | None = None
    results = []
    for row in rows:
        undo: Callable[[], None] = lambda: None  # noqa: E731
        made: list[Callable[..., Any]] = []
        try:
            if row in loops:
                run = loop_runner(loops[row])
            else:
                run, undo = hf_runner(row, model, cuda)
            with graph_notes.collecting() if row.startswith("hf_opgen") else contextlib.nullcontext([]) as made:
                first, tokens = timed(run, ids, new, sync)
                one, full = [], []
                for _ in range(repeats):
                    one.append(timed(run, ids, 1, sync)[0])
                    full.append(timed(run, ids, new, sync)[0])
            if reference is None:
                reference = tokens
            t1, tn = statistics.median(one), statistics.median(full)
            equal = None if row == "hf_floor" else _leading_equal(tokens, reference)  # its tokens are not the model's
            result = Result(row, prompt, batch, first, 1e3 * t1, 1e3 * (tn - t1) / (new - 1), batch * new / tn, equal)
            if row in loops:
                result = _with_loop_checks(result, loops, row, ids, reference, batch, device)
            result = replace(result, note=graph_notes.note(made))
        except Exception as exc:  # a row that cannot run is a row with its reason
            result = Result(row, prompt, batch, None, None, None, None, None, error=reason(exc))
        finally:
            undo()
        print(f"  prompt {prompt}, batch {batch}: {LABELS[row]}: "
              f"{result.error or f'{result.decode_ms:.3f} ms/token'}", flush=True)  # fmt: skip
        results.append(result)
    return results


def _with_loop_checks(result: Result, loops: dict[str, Generator], row: str, ids: torch.Tensor,
                      reference: list[list[int]], batch: int, device: torch.device) -> Result:  # fmt: skip
    eager = loops["_eager"].steps(batch)
    mine = loops[row].steps(batch)
    want = forced_logits(eager, ids, reference)
    got = forced_logits(mine, ids, reference)
    scale = max(float(w.abs().max()) for w in want) or 1.0
    err = max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) / scale
    middle = ids.shape[1] + len(reference[0]) // 2  # the step where the generation's decode is halfway
    step = step_time(mine, batch, 50, device, middle) if row == "opgen_loop" else None
    return Result(**{**asdict(result), "logit_err": err, "step_ms": step})


def _leading_equal(tokens: list[list[int]], reference: list[list[int]]) -> int:
    """Tokens equal to the reference's before the first difference, the fewest over the rows."""
    counts = []
    for mine, ref in zip(tokens, reference, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b), min(len(mine), len(ref)))
        counts.append(n)
    return min(counts)


def results_table(results: Sequence[Result]) -> str:
    headers = ["prompt", "batch", "path", "first call s", "prefill ms", "decode ms/token", "tokens/s",
               "tokens == eager", "logit err", "step ms", "note"]  # fmt: skip

    def f(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    rows = [[r.prompt, r.batch, LABELS[r.row], f(r.first_call_s, ".1f"), f(r.prefill_ms, ".2f"), f(r.decode_ms, ".3f"),
             f(r.tokens_per_s, ".1f"), "-" if r.equal_tokens is None else str(r.equal_tokens),
             f(r.logit_err, ".1e"), f(r.step_ms, ".3f"), r.error or r.note] for r in results]  # fmt: skip
    return format_table(headers, rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where there is a GPU, else cpu")
    parser.add_argument("--family", choices=list(FAMILIES), default="llama")
    parser.add_argument("--size", choices=("tiny", "real"), help="default: real on cuda, tiny on cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--prompts", type=int, nargs="+", default=[32, 512], help="prompt lengths (default 32 512)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)")
    parser.add_argument("--new", type=int, default=128, help="new tokens per generation (default 128)")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="paths to run (eager first)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per row and case (default 3)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv or [])
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("python -m opgen.bench generate: --device cuda needs a CUDA GPU")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if args.new < 2 or args.repeats < 1 or min(args.prompts + args.batches) < 1:
        raise SystemExit("python -m opgen.bench generate: --new >= 2, --repeats >= 1, prompts and batches >= 1")
    size = args.size or ("real" if cuda else "tiny")
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    rows = ["eager"] + [r for r in args.rows if r != "eager"]
    model = causal_lm(args.family, size, device=device, dtype=dtype)
    max_cache = max(args.prompts) + args.new
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", max_cache)
    if max_cache > limit:
        raise SystemExit(f"python -m opgen.bench generate: prompt + new = {max_cache} exceeds the model's {limit} "
                         f"positions (--size real, or shorter --prompts)")  # fmt: skip
    where = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} thread(s)"
    copy_bw = copy_bandwidth(device)
    print(f"opgen generate benchmark: torch {torch.__version__}, {where}, {args.family} {size} "
          f"({FAMILIES[args.family].checkpoint if size == 'real' else 'tiny'}), {args.dtype or dtype}, "
          f"static cache of {max_cache}, greedy, {args.new} new tokens; copy bandwidth {copy_bw / 1e9:.0f} GB/s",
          flush=True)  # fmt: skip
    loops: dict[str, Generator] = {"_eager": Generator(model, max_cache=max_cache, compiler="eager")}
    if "loop_inductor" in rows:
        loops["loop_inductor"] = Generator(model, max_cache=max_cache, compiler="inductor")
    if "opgen_loop" in rows:
        loops["opgen_loop"] = Generator(model, max_cache=max_cache)
    results: list[Result] = []
    with torch.no_grad():
        for batch in args.batches:
            for prompt in args.prompts:
                results += run_case(rows, model, loops, prompt, batch, args.new, args.repeats, device)
    print(f"\nmedian of {args.repeats} repeats; tokens/s = batch x {args.new} / time of the whole generation")
    print(results_table(results))
    if "opgen_loop" in loops:
        counts = {b: loops["opgen_loop"].steps(b).prefill.report().specializations for b in args.batches}
        print(f"opgen loop: prefill functions per batch size after prompts {args.prompts}: {counts} (1 = no recompile)")
    if args.json:
        payload = {"torch": torch.__version__, "device": where, "family": args.family, "size": size,
                   "copy_bandwidth": copy_bw, "results": [asdict(r) for r in results]}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"wrote {args.json}")
    return 0
