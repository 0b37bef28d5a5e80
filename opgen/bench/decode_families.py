"""`python -m opgen.bench decode --families ...`: the decode step of each LLM family users bring, per batch size.

Models: the families of `opgen.bench.llm_families` (Llama, Qwen2, Mistral, Gemma, Gemma-2, Phi-3, OLMo-2,
GPT-2), transformers configs with real checkpoints' widths on CUDA and tiny ones on the CPU (`--size`),
random weights, bf16 on CUDA and float32 on the CPU (`--dtype`). One step is transformers' static-cache
export wrapper at batch B: token ids [B, 1] (every row fed the same token) and the cache position [1].
The candidates, timing and teacher-forced check are `opgen.bench.decode`'s (row 0's logits against
eager's at every checked step). Besides its columns, per row:

- **kernels/layer**: the GPU activities of one step (kernels, copies and memsets, inside CUDA graphs
  too; the profiler's count, `opgen.bench.gpu_work.kernel_table`) over the model's decoder layers. CUDA
  only.
- **x r-o**: the step's time over reduce-overhead's (the `compile` candidate) on the same model.
- **% copy BW**: bytes one step must read (every weight once, whatever the batch, and every row's KV
  cache up to the timed positions) per second, over the copy bandwidth measured in the run.
- **max logit err**: ok where it is within the bench's fixed tolerance (`decode.TOLERANCE`), as before,
  or within `RO_SLACK` times reduce-overhead's error on the same model and batch: in bf16 two compiled
  paths round differently from eager by errors of one size, and reduce-overhead's is the bar the decode
  issue sets. Reduce-overhead's own row keeps the fixed tolerance.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import torch

from opgen.bench import decode
from opgen.bench.llm_families import FAMILIES, causal_lm, step
from opgen.bench.memory import free_memory
from opgen.bench.timing import format_table

KERNEL_CALLS = 5  # steps profiled to count a step's GPU activities
RO_SLACK = 1.5  # a candidate's logit error within this many times reduce-overhead's is ok


@dataclass(frozen=True, slots=True)
class Row:
    result: decode.Result  # `model` is the family, `size` its widths ("real" or "tiny")
    batch: int
    layers: int
    kernels_per_layer: float | None  # None off CUDA or where the candidate did not run


def run_family(family: str, size: str, batch: int, dtype: torch.dtype, candidates: Sequence[str],
               plan: decode.Plan, device: torch.device, copy_bw: float) -> list[Row]:  # fmt: skip
    """Every candidate on one family at one batch size: build, check against eager, time interleaved, count
    kernels; then free it all (as `decode.run_model`)."""
    torch._dynamo.reset()
    free_memory(device)
    try:
        lm = causal_lm(family, size, device=device, dtype=dtype)
        layers, vocab = int(lm.config.num_hidden_layers), int(lm.config.vocab_size)
        model = step(lm, plan.max_seq, batch)
    except (decode.Skipped, ImportError, torch.OutOfMemoryError) as exc:
        return [Row(decode.failed_result(family, size, name, 0, plan, decode.reason(exc)), batch, 0, None)
                for name in candidates]  # fmt: skip
    try:
        named = (family, size, f"{family} {size} batch {batch}")
        kernels = functools.partial(_kernels_per_layer, layers=layers, device=device)
        measured = decode.measure(model, named, dtype, vocab, candidates, plan, device, copy_bw, batch, kernels)
        return against_reduce_overhead([Row(result, batch, layers, counted) for result, counted in measured])
    finally:
        del model, lm
        torch._dynamo.reset()
        free_memory(device)


def against_reduce_overhead(rows: list[Row]) -> list[Row]:
    """The rows of one model and batch, each compiled candidate's logits also ok where its error is within
    `RO_SLACK` times reduce-overhead's (the `compile` candidate's) on them."""
    bar = next((r.result.max_logit_err for r in rows if r.result.candidate == "compile"), None)
    if bar is None:
        return rows
    return [
        replace(row, result=replace(row.result, agrees=True))
        if row.result.candidate not in ("eager", "compile") and row.result.max_logit_err is not None
        and not row.result.agrees and row.result.max_logit_err <= RO_SLACK * bar
        else row
        for row in rows
    ]  # fmt: skip


def _kernels_per_layer(call: decode.Step, inputs: tuple[torch.Tensor, torch.Tensor], layers: int,
                       device: torch.device) -> float | None:  # fmt: skip
    if device.type != "cuda":
        return None
    from opgen.bench.gpu_work import kernel_table, totals

    _, activities = totals(kernel_table(lambda: call(*inputs), KERNEL_CALLS))
    return activities / layers


def table(rows: Sequence[Row], cuda: bool) -> str:
    """One line per family, batch and candidate; x r-o against the `compile` candidate of the same model."""
    reduce_overhead = {(r.result.model, r.batch): r.result.ms_per_token for r in rows
                       if r.result.candidate == "compile"}  # fmt: skip
    headers = ["family", "widths", "batch", "candidate", "ms/token (min-max)", "x eager", "x r-o", "% copy BW",
               "kernels/layer", "tokens == eager", "max logit err", "note"]  # fmt: skip
    lines = []
    for row in rows:
        r, c = row.result, row.result.cells()
        ro = reduce_overhead.get((r.model, row.batch))
        lines.append([
            r.model, FAMILIES[r.model].checkpoint if r.size == "real" else r.size, str(row.batch),
            decode.label(r.candidate, cuda), c["time"], c["x eager"],
            f"{r.ms_per_token / ro:.3f}" if r.ms_per_token is not None and ro else "-", c["bandwidth"],
            f"{row.kernels_per_layer:.1f}" if row.kernels_per_layer is not None else "-",
            c["tokens"], c["logits"], r.error,
        ])  # fmt: skip
    return format_table(headers, lines)


def default_candidates(cuda: bool) -> tuple[str, ...]:
    return ("eager", "compile", "opgen_graphs") if cuda else ("eager", "opgen")


def parser() -> argparse.ArgumentParser:
    """`opgen.bench.decode`'s options and the families' own."""
    parser = decode.parser()
    group = parser.add_argument_group("LLM families: in place of --models/--sizes (opgen.bench.decode_families)")
    group.add_argument("--families", nargs="+", choices=[*FAMILIES, "all"],
                       help="transformers' families with random weights ('all': every one)")  # fmt: skip
    group.add_argument("--batches", nargs="+", type=int, default=[1, 8], help="batch sizes (default 1 8)")
    group.add_argument("--size", choices=("real", "tiny"), help="real checkpoints' widths (default on CUDA) or "
                       "tiny ones (default on the CPU)")  # fmt: skip
    group.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                       help="weights and cache (default bfloat16 on CUDA, float32 on the CPU)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m opgen.bench decode`: with --families, every family at every batch size; else the two Llamas."""
    args = parser().parse_args(argv or [])
    if not args.families:
        return decode.main(argv)
    if min(args.batches) < 1:
        raise SystemExit("python -m opgen.bench decode: --batches must be >= 1")
    setting = decode.setup(args, default_candidates, ", ".join(map(str, args.batches)))
    families = list(FAMILIES) if "all" in args.families else list(dict.fromkeys(args.families))
    size = args.size or ("real" if setting.cuda else "tiny")
    dtype = getattr(torch, args.dtype or ("bfloat16" if setting.cuda else "float32"))
    rows: list[Row] = []
    with torch.no_grad():
        for family in families:
            for batch in args.batches:
                measured = run_family(family, size, batch, dtype, setting.candidates, setting.plan, setting.device,
                                      setting.copy_bw)  # fmt: skip
                rows += measured
                if len(families) * len(args.batches) > 1:  # each model's rows as they come: a run cut short keeps them
                    print(table(measured, setting.cuda), flush=True)
    print(f"{decode.timed_line(setting.plan)}; {dtype}")
    print(table(rows, setting.cuda))
    if args.json:
        results = [{**asdict(r.result), "batch": r.batch, "layers": r.layers, "kernels_per_layer": r.kernels_per_layer}
                   for r in rows]  # fmt: skip
        decode.write_json(args.json, setting, results, dtype=str(dtype))
    return 0
