"""`python -m opgen.bench decode`: LLM decoding as gpt-fast measures it, batch 1, a static KV cache.

Models (decode_models.py): a gpt-fast-style Llama of our own and transformers' LlamaForCausalLM in
its static-cache export wrapper, random weights, at the shapes of `--sizes` (tiny, Llama-3.2-1B,
Llama-3.1-8B). One step = one call with token ids [1, 1] and the cache position [1], plus a
synchronize on CUDA. Per candidate: first-call time (compile included; reduce-overhead's first three
calls, as it records on a later one), per-token time (each repeat runs `--steps` steps at positions
after the checked generation and takes their median; the table gives the median over the repeats
with their min and max, candidates interleaved, ../shared/BENCH.md), tokens/s, bytes read per token
(weights once, plus the KV cache up to the step's position) and the fraction of the copy bandwidth
measured in this run (`y.copy_(x)`, read + write). Correctness: each candidate decodes `--check`
greedy tokens fed eager's tokens (teacher forcing), so its argmax and logits compare with eager's
at every step: "tokens == eager" counts equal tokens, "max logit err" is the largest difference.
A candidate that cannot run (no CUDA, no transformers, a compile error) is a row with the reason.
The command's entry is `opgen.bench.decode_families`, which with `--families` runs transformers' LLM
families at several batch sizes on this module's machinery instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import opgen  # also registers the "opgen" torch.compile backend
from opgen.bench import decode_models as dm
from opgen.bench.memory import available_memory, free_memory
from opgen.bench.timing import copy_bandwidth, device_sync, format_table

CANDIDATES = ("eager", "compile", "opgen", "opgen_cpp", "opgen_graphs", "opgen_backend")
FIRST_CALLS = {"compile": 3}  # reduce-overhead's cudagraph trees warm up, then record on a later call
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}  # logit error / max |logit|
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def label(name: str, cuda: bool) -> str:
    return {
        "eager": "eager",
        "compile": 'torch.compile mode="reduce-overhead"' if cuda else "torch.compile (inductor)",
        "opgen": 'opgen.compile backend="python"',
        "opgen_cpp": 'opgen.compile backend="cpp"',
        "opgen_graphs": "opgen.compile cuda_graphs",
        "opgen_backend": 'torch.compile(backend="opgen")',
    }[name]


class Skipped(Exception):
    """A candidate or model that cannot run here; the message is the reason."""


@dataclass(frozen=True, slots=True)
class Generation:
    tokens: list[int]  # the argmax after each of the last `steps` calls
    logits: list[torch.Tensor]  # those calls' logits, float32 on the CPU


def generate(step: Step, prompt_ids: torch.Tensor, steps: int, forced: Sequence[int] | None = None,
             batch: int = 1) -> Generation:  # fmt: skip
    """Greedy decoding one token per call: the prompt [1, P] fed token by token at positions 0..P-1,
    then `steps` new tokens, each the argmax of the call before (or `forced[i]`: teacher forcing, so
    a candidate's logits compare with a reference's at every step). Makes P + steps - 1 calls. With
    `batch` > 1 every row is fed the same token (ids [batch, 1]) and row 0 is read."""
    device, prompt = prompt_ids.device, prompt_ids[0].tolist()
    feed = prompt + list(forced or [])
    tokens: list[int] = []
    logits: list[torch.Tensor] = []
    for pos in range(len(prompt) + steps - 1):
        token = feed[pos] if pos < len(feed) else tokens[-1]
        ids = torch.full((batch, 1), token, dtype=torch.long, device=device)
        out = step(ids, torch.tensor([pos], dtype=torch.long, device=device))
        if pos >= len(prompt) - 1:
            row = out[0, -1].float().cpu()  # a copy: a CUDA-graph replay may overwrite `out`
            logits.append(row)
            tokens.append(int(row.argmax()))
    return Generation(tokens, logits)


Ready = tuple[Step, float, Generation]  # a candidate that runs: its step, first-call seconds, checked generation


@dataclass(frozen=True, slots=True)
class Result:
    model: str
    size: str
    candidate: str
    first_call_s: float | None
    ms_per_token: float | None
    min_ms: float | None
    max_ms: float | None
    ratio: float | None
    bytes_per_token: int
    bandwidth_fraction: float | None
    argmax_equal: int | None
    checked: int
    max_logit_err: float | None
    agrees: bool | None
    error: str = ""

    @property
    def tokens_per_s(self) -> float | None:
        return 1e3 / self.ms_per_token if self.ms_per_token else None

    def cells(self) -> dict[str, str]:
        """Its table cells: "time" (ms/token, min-max), "x eager", "bandwidth" (%), "tokens", "logits"."""
        timed = self.ms_per_token is not None
        return {
            "time": f"{self.ms_per_token:.3f} ({self.min_ms:.3f}-{self.max_ms:.3f})" if timed else "-",
            "x eager": f"{self.ratio:.3f}" if self.ratio is not None else "-",
            "bandwidth": f"{100 * self.bandwidth_fraction:.1f}" if self.bandwidth_fraction is not None else "-",
            "tokens": f"{self.argmax_equal}/{self.checked}" if self.argmax_equal is not None else "-",
            "logits": f"{self.max_logit_err:.1e} ({'ok' if self.agrees else 'NOT ok'})"
            if self.max_logit_err is not None else "-",
        }  # fmt: skip


def make_step(name: str, model: torch.nn.Module, example: tuple[torch.Tensor, ...], device: torch.device) -> Step:
    cuda = device.type == "cuda"
    match name:
        case "eager":
            return model
        case "compile":
            return torch.compile(model, mode="reduce-overhead") if cuda else torch.compile(model)  # type: ignore[return-value]
        case "opgen":
            return opgen.compile(model, example, backend="python")  # type: ignore[no-any-return]
        case "opgen_cpp":
            return opgen.compile(model, example, backend="cpp")  # type: ignore[no-any-return]
        case "opgen_graphs":
            if not cuda:
                raise Skipped("CUDA-graph mode needs CUDA")
            return opgen.compile(model, example, cuda_graphs=True)  # type: ignore[no-any-return]
        case "opgen_backend":
            return torch.compile(model, backend="opgen")  # type: ignore[return-value]
    raise ValueError(f"unknown candidate {name!r}")


def first_call(name: str, model: torch.nn.Module, device: torch.device, batch: int = 1) -> tuple[Step, float]:
    """Build the candidate and make its first calls, synchronized: (the step, seconds)."""
    sync = device_sync(device)
    example = (torch.zeros(batch, 1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device))
    sync()
    start = time.perf_counter()
    step = make_step(name, model, example, device)
    for _ in range(FIRST_CALLS.get(name, 1)):
        step(*example)
    sync()
    return step, time.perf_counter() - start


def time_steps(steps: Sequence[Step], inputs: Sequence[tuple[torch.Tensor, torch.Tensor]], repeats: int,
               device: torch.device, before: Callable[[], Any] | None = None,
               ) -> list[tuple[float, float, float]]:  # fmt: skip
    """Per candidate, (median, min, max) over the repeats of the median step time in ms; interleaved.
    `before` runs before each candidate's repeat (the tensor-parallel bench's barrier: ranks in lockstep)."""
    sync, clock = device_sync(device), time.perf_counter
    for step in steps:  # warm-up: one pass over the positions
        for ids, pos in inputs:
            step(ids, pos)
    sync()
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for i, step in enumerate(steps):
            if before is not None:
                before()
            times = []
            for ids, pos in inputs:
                start = clock()
                step(ids, pos)
                sync()
                times.append(clock() - start)
            samples[i].append(statistics.median(times) * 1e3)
    return [(statistics.median(s), min(s), max(s)) for s in samples]


@dataclass(frozen=True, slots=True)
class Plan:
    prompt: int
    check: int
    steps: int
    repeats: int

    @property
    def max_seq(self) -> int:
        return self.prompt + self.check + self.steps

    @property
    def timed_positions(self) -> range:
        return range(self.prompt + self.check, self.max_seq)


def run_model(family: str, shape: dm.Shape, candidates: Sequence[str], plan: Plan, device: torch.device,
              copy_bw: float) -> list[Result]:  # fmt: skip
    """Every candidate on one model: build, check against eager, time interleaved; then free it all.

    The candidates share the model's weights and KV cache (each run starts at position 0 and writes
    a position before any step reads it); nothing of the model outlives the call."""
    torch._dynamo.reset()  # before any candidate: a reset drops reduce-overhead's graphs, so never between them
    free_memory(device)
    try:
        _check_memory(shape, device)
        model = dm.build(family, shape, plan.max_seq, device)
    except (Skipped, ImportError) as exc:
        return [failed_result(family, shape.name, name, 0, plan, reason(exc)) for name in candidates]
    try:
        named = (family, shape.name, f"{family} {shape.name}")
        measured = measure(model, named, shape.dtype, shape.vocab, candidates, plan, device, copy_bw)
        return [result for result, _ in measured]
    finally:
        del model
        torch._dynamo.reset()
        free_memory(device)


Probe = Callable[[Step, tuple[torch.Tensor, torch.Tensor]], Any]  # a candidate's step, its first timed inputs


def measure(model: torch.nn.Module, named: tuple[str, str, str], dtype: torch.dtype, vocab: int,
            candidates: Sequence[str], plan: Plan, device: torch.device, copy_bw: float, batch: int = 1,
            probe: Probe | None = None) -> list[tuple[Result, Any]]:  # fmt: skip
    """Every candidate on a built model (`named`: its name and size for the rows, and what the progress
    lines call it): build, check against eager, time interleaved, every row of the batch fed one token
    (the reference's; row 0 read); per candidate, its result and what `probe` says of its step (None
    where it did not run or there is no probe). The candidates' steps are dropped before it returns."""
    model_name, size, shown = named
    positions = plan.timed_positions
    cached = round(statistics.mean(p + 1 for p in positions))  # positions a timed step reads, on average
    per_token = dm.weight_bytes(model) + dm.kv_bytes_per_position(model) * cached
    ready: dict[str, Ready] = {}
    try:
        failed = build_candidates(model, shown, vocab, candidates, plan, device, ready, batch)
        reference = next(iter(ready.values()))[2] if ready else None
        if reference is None:
            return [(failed_result(model_name, size, name, per_token, plan, failed.get(name, "not run")), None)
                    for name in candidates]  # fmt: skip
        tokens = reference.tokens
        inputs = [(torch.full((batch, 1), tokens[i % len(tokens)], device=device), torch.tensor([p], device=device))
                  for i, p in enumerate(positions)]  # fmt: skip
        timings = dict(zip(ready, time_steps([r[0] for r in ready.values()], inputs, plan.repeats, device),
                           strict=True))  # fmt: skip
        measured: list[tuple[Result, Any]] = []
        for name in candidates:
            if name not in ready:
                measured.append((failed_result(model_name, size, name, per_token, plan, failed.get(name, "not run")),
                                 None))  # fmt: skip
                continue
            result = checked_result(model_name, size, dtype, name, ready[name], reference, timings, per_token, copy_bw)
            measured.append((result, probe(ready[name][0], inputs[0]) if probe is not None else None))
        return measured
    finally:
        ready.clear()


def build_candidates(model: torch.nn.Module, model_name: str, vocab: int, candidates: Sequence[str], plan: Plan,
                     device: torch.device, ready: dict[str, Ready], batch: int = 1) -> dict[str, str]:  # fmt: skip
    """Fill `ready` with (step, first-call seconds, checked generation) per candidate; return the failures'
    reasons. The first candidate that runs (eager) is the reference the others are fed and compared with."""
    prompt = torch.randint(0, vocab, (1, plan.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    failed: dict[str, str] = {}
    for name in candidates:
        what = f"{model_name}: {label(name, device.type == 'cuda')}"
        reference = next(iter(ready.values()))[2].tokens if ready else None
        try:
            step, seconds = first_call(name, model, device, batch)
            ready[name] = (step, seconds, generate(step, prompt, plan.check, reference, batch))
        except Exception as exc:  # a candidate's failure is a row entry, not the end of the table
            failed[name] = reason(exc)
            print(f"  {what}: {failed[name]}", flush=True)
            free_memory(device)
            continue
        print(f"  {what} ready in {seconds:.2f} s", flush=True)
    return failed


def checked_result(model: str, size: str, dtype: torch.dtype, name: str, ready: Ready, reference: Generation,
            timings: dict[str, tuple[float, float, float]], per_token: int, copy_bw: float) -> Result:  # fmt: skip
    _, seconds, gen = ready
    med, lo, hi = timings[name]
    base = timings[next(iter(timings))][0]  # the first candidate: eager
    equal = sum(a == b for a, b in zip(gen.tokens, reference.tokens, strict=True))
    err = max(float((a - b).abs().max()) for a, b in zip(gen.logits, reference.logits, strict=True))
    scale = max(float(r.abs().max()) for r in reference.logits) or 1.0
    agrees = equal == len(gen.tokens) or err <= TOLERANCE.get(dtype, 1e-4) * scale
    fraction = per_token / (med * 1e-3) / copy_bw
    return Result(model, size, name, seconds, med, lo, hi, med / base, per_token, fraction, equal,
                  len(gen.tokens), err, agrees)  # fmt: skip


def failed_result(model: str, size: str, name: str, per_token: int, plan: Plan, why: str) -> Result:
    return Result(model, size, name, None, None, None, None, None, per_token, None, None, plan.check,
                  None, None, why)  # fmt: skip


def reason(exc: BaseException) -> str:
    if isinstance(exc, Skipped):
        return f"skipped: {exc}"
    inner = getattr(exc, "inner_exception", None)  # Dynamo's BackendCompilerFailed wraps the backend's error
    if isinstance(inner, BaseException):
        return f"{type(exc).__name__} <- {reason(inner)}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:120] if lines else ''}".rstrip(": ")


def _check_memory(shape: dm.Shape, device: torch.device) -> None:
    need = int(dm.estimated_bytes(shape) * 1.5) + 2**30  # the weights, plus room for activations and copies
    free = available_memory(device)
    if free is not None and free < need:
        raise Skipped(f"needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")


def results_table(results: Sequence[Result], cuda: bool) -> str:
    headers = ["model", "size", "candidate", "first call s", "ms/token (min-max)", "x eager", "tokens/s",
               "MB/token", "% copy BW", "tokens == eager", "max logit err", "note"]  # fmt: skip
    rows = []
    for r in results:
        c = r.cells()
        rows.append([
            r.model, r.size, label(r.candidate, cuda),
            f"{r.first_call_s:.2f}" if r.first_call_s is not None else "-",
            c["time"], c["x eager"], f"{r.tokens_per_s:.1f}" if r.tokens_per_s else "-",
            f"{r.bytes_per_token / 1e6:.2f}", c["bandwidth"], c["tokens"], c["logits"], r.error,
        ])  # fmt: skip
    return format_table(headers, rows)


def parser() -> argparse.ArgumentParser:
    """The command's options (`opgen.bench.decode_families` adds its own to them)."""
    parser = argparse.ArgumentParser(prog="python -m opgen.bench decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where there is a GPU, else cpu")
    parser.add_argument("--sizes", nargs="+", choices=list(dm.SHAPES), help="model shapes (default: 1b on cuda, "
                        "tiny on cpu); 8b needs ~16 GB per copy and is skipped where memory is short")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="shorthand for --sizes tiny")
    parser.add_argument("--models", nargs="+", choices=dm.FAMILIES, default=list(dm.FAMILIES))
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES,
                        help="what to compare (eager always runs, first: it is the reference; default: all, with "
                        "--families eager, compile and opgen_graphs on CUDA, eager and opgen on the CPU)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=64, help="timed decode steps per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per candidate (default 5)")
    parser.add_argument("--check", type=int, default=32, help="greedy tokens checked against eager (default 32)")
    parser.add_argument("--prompt", type=int, default=4, help="prompt tokens, fed one per step (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    return parser


@dataclass(frozen=True, slots=True)
class Setting:
    """What a run of the command measures on: its device, plan, candidates and the copy bandwidth it measured."""

    device: torch.device
    where: str  # the device, in words
    plan: Plan
    candidates: tuple[str, ...]  # eager first: the reference
    copy_bw: float

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def setup(args: argparse.Namespace, default_candidates: Callable[[bool], Sequence[str]], batches: str = "1") -> Setting:
    """Checks the shared options, measures the copy bandwidth and prints the run's header line.
    `default_candidates(cuda)`: what runs where --candidates is not given."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("python -m opgen.bench decode: --device cuda needs a CUDA GPU")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if min(args.steps, args.check, args.prompt, args.repeats) < 1:
        raise SystemExit("python -m opgen.bench decode: --steps, --check, --prompt and --repeats must be >= 1")
    chosen = args.candidates or default_candidates(device.type == "cuda")
    plan = Plan(args.prompt, args.check, args.steps, args.repeats)
    if device.type != "cuda":
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    copy_bw = copy_bandwidth(device)
    print(f"opgen decode benchmark: torch {torch.__version__}, {where}, no_grad, batch {batches}, static KV cache "
          f"of {plan.max_seq} positions; copy bandwidth {copy_bw / 1e9:.1f} GB/s (read + write)",
          flush=True)  # fmt: skip
    return Setting(device, where, plan, ("eager", *(c for c in chosen if c != "eager")), copy_bw)


def write_json(path: Path, setting: Setting, results: list[dict[str, Any]], **extra: Any) -> None:
    payload = {"torch": torch.__version__, "device": setting.where, "copy_bandwidth": setting.copy_bw,
               "plan": asdict(setting.plan), **extra, "results": results}  # fmt: skip
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")


def timed_line(plan: Plan) -> str:
    return (f"\n{plan.steps} timed steps at positions {plan.timed_positions.start}-{plan.max_seq - 1}, median per "
            f"repeat, then median (min-max) of {plan.repeats} interleaved repeats")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv or [])
    setting = setup(args, lambda cuda: CANDIDATES)
    sizes = ["tiny"] if args.tiny else args.sizes or (["1b"] if setting.cuda else ["tiny"])
    results: list[Result] = []
    with torch.no_grad():
        for size in sizes:
            for family in args.models:
                results += run_model(family, dm.SHAPES[size], setting.candidates, setting.plan, setting.device,
                                     setting.copy_bw)  # fmt: skip
    print(timed_line(setting.plan))
    print(results_table(results, setting.cuda))
    if args.json:
        write_json(args.json, setting, [asdict(r) for r in results])
    return 0
