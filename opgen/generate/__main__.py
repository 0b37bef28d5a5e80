"""`python -m opgen.generate`: text generation with opgen's loop, from the command line.

    python -m opgen.generate --family llama --prompt-ids "1 2 3" --prompt-ids "4 5" --max-new-tokens 32
    python -m opgen.generate --family llama --size real --batch 4 --prompt-len 128 --repeat 3
    python -m opgen.generate --checkpoint ./model --prompt "Once upon a time" --temperature 0.8 --top-p 0.9

The model is a family of opgen.bench.llm_families with random weights (`--family`, `--size`) or a local
transformers checkpoint folder (`--checkpoint`; nothing is downloaded). Prompts are token ids
(`--prompt-ids`, repeatable: prompts of any lengths, side by side), text (`--prompt`, with the
checkpoint's tokenizer) or random ids (`--prompt-len` tokens times `--batch`, seeded by `--seed`).
stdout: each row's new tokens (ids, or text with a tokenizer), then a line of timings; stderr: progress.
`--repeat N` runs the generation N times and reports the last, so the first call's compile is left out
(its time, compile included, is in the summary line).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from opgen.bench.llm_families import FAMILIES, causal_lm
from opgen.cli import until_reader_leaves
from opgen.generate.errors import GenerationError
from opgen.generate.loop import COMPILERS, EOS, Generation, Generator, StepTokens
from opgen.generate.sampling import Sampling

PROG = "python -m opgen.generate"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")  # fmt: skip
PROMPT_LEN, BATCH = 16, 1  # random prompts' defaults
PROGRESS_OVER = 32  # new tokens past which the bar shows when stderr is not a terminal


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))  # fmt: skip
    group = parser.add_argument_group("model")
    model = group.add_mutually_exclusive_group(required=True)
    model.add_argument("--family", choices=list(FAMILIES), help="random weights at a family's shapes")
    model.add_argument("--checkpoint", type=Path, metavar="DIR", help="a local transformers checkpoint folder")
    group.add_argument("--size", choices=("tiny", "real"), default="tiny",
                       help="--family's widths: test size or a published checkpoint's (default tiny)")  # fmt: skip
    group = parser.add_argument_group("prompts (default: random ids)")
    prompts = group.add_mutually_exclusive_group()
    prompts.add_argument("--prompt-ids", action="append", metavar="IDS",
                         help='a prompt\'s token ids, "1 2 3" (repeatable: a batch of any lengths)')  # fmt: skip
    prompts.add_argument("--prompt", action="append", metavar="TEXT",
                         help="a prompt as text (repeatable; needs the checkpoint's tokenizer)")  # fmt: skip
    group.add_argument("--prompt-len", type=int, help=f"random prompts' tokens (default {PROMPT_LEN})")
    group.add_argument("--batch", type=int, help=f"random prompts (default {BATCH})")
    gen = parser.add_argument_group("generation")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="per row (default 64)")
    gen.add_argument("--max-cache", type=int, help="KV-cache positions per row (default: the Generator's, or "
                     "the longest prompt plus --max-new-tokens where that is more)")  # fmt: skip
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    gen.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (default 0: all)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass (default 1.0: all)")
    gen.add_argument("--seed", type=int, default=0, help="seeds the random prompts and the sampling (default 0)")
    gen.add_argument("--stop-ids", metavar="IDS",
                     help='tokens that end a row, "2 7" ("" for none; default: the model\'s eos)')  # fmt: skip
    run = parser.add_argument_group("run")
    run.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where there is a GPU, else cpu")
    run.add_argument("--dtype", choices=list(DTYPES), help="default: bfloat16 on cuda, float32 on cpu")
    run.add_argument("--compiler", choices=COMPILERS, default="opgen", help="default opgen")
    run.add_argument("--backend", choices=("auto", "cpp", "python"), default="auto",
                     help="opgen.compile's backend (default auto)")  # fmt: skip
    run.add_argument("--no-cuda-graphs", action="store_true", help="launch the decode step without a CUDA graph")
    run.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                     help="run prompts as chunks of N tokens through one static graph (0: the dynamic prefill "
                          "only; default 256 with CUDA graphs, else 0)")  # fmt: skip
    run.add_argument("--repeat", type=int, default=1, help="generations run; the last is reported (default 1)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _device_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise GenerationError("--device cuda needs a CUDA GPU")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    return device, dtype


def load_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    """The model, and its tokenizer where a checkpoint folder has one (else None)."""
    if args.family is not None:
        return causal_lm(args.family, args.size, device=device, dtype=dtype), None
    folder: Path = args.checkpoint
    if not folder.is_dir():
        raise GenerationError(f"--checkpoint {folder}: no such folder")
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as e:
        raise GenerationError(f"--checkpoint {folder}: not a transformers causal-LM checkpoint ({e})") from e
    return model.to(device).eval(), _tokenizer(folder)


def _tokenizer(folder: Path) -> Any:
    """The folder's tokenizer, or None (transformers makes an empty one where there are no files: not that)."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception:
        return None
    return tokenizer if getattr(tokenizer, "vocab_size", 0) else None


def parse_ids(text: str, what: str) -> list[int]:
    """Token ids as written on the command line: "1 2 3" or "1,2,3"."""
    try:
        return [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise GenerationError(f'{what} {text!r}: token ids are integers, "1 2 3"') from None


def prompt_rows(args: argparse.Namespace, vocab: int, tokenizer: Any) -> list[list[int]]:
    """The prompts as token ids (checked against the vocabulary by the Generator)."""
    explicit = args.prompt_ids is not None or args.prompt is not None
    if explicit and (args.prompt_len is not None or args.batch is not None):
        raise GenerationError("--prompt-len and --batch make random prompts: not with --prompt or --prompt-ids")
    if args.prompt_ids is not None:
        return [parse_ids(text, "--prompt-ids") for text in args.prompt_ids]
    if args.prompt is not None:
        if tokenizer is None:
            raise GenerationError("--prompt needs a tokenizer: a --checkpoint folder with one (else --prompt-ids)")
        return [list(tokenizer.encode(text)) for text in args.prompt]
    length = PROMPT_LEN if args.prompt_len is None else args.prompt_len
    batch = BATCH if args.batch is None else args.batch
    if length < 1 or batch < 1:
        raise GenerationError(f"--prompt-len and --batch must be >= 1, got {length} and {batch}")
    draws = torch.Generator().manual_seed(args.seed)
    return torch.randint(0, vocab, (batch, length), generator=draws).tolist()  # type: ignore[no-any-return]


def make_generator(model: nn.Module, args: argparse.Namespace) -> Generator:
    return Generator(model, max_cache=args.max_cache, compiler=args.compiler,
                     cuda_graphs=False if args.no_cuda_graphs else None, backend=args.backend,
                     prefill_chunk=args.prefill_chunk)  # fmt: skip


def fit_cache(gen: Generator, args: argparse.Namespace, rows: list[list[int]]) -> Generator:
    """Without --max-cache, the Generator's default cache, grown to the longest prompt plus the new tokens."""
    need = max(map(len, rows)) + args.max_new_tokens
    assert gen.max_cache is not None
    if args.max_cache is not None or need <= gen.max_cache:
        return gen
    return dataclasses.replace(gen, max_cache=need)


class Progress:
    """An in-place bar on a stream: steps of max, and new tokens per second since the first token."""

    def __init__(self, total: int, stream: TextIO, label: str = "", width: int = 30, every_s: float = 0.1) -> None:
        self.total, self.stream, self.label, self.width, self.every_s = total, stream, label, width, every_s
        self.steps = self.tokens = self.drawn_steps = 0
        self.start = self.drawn = 0.0

    def __call__(self, step: StepTokens) -> None:
        now = time.perf_counter()
        if step.step == 0:
            self.start = now  # the rate leaves out the compile and the prefill
        else:
            self.tokens += sum(t is not None for t in step.tokens)
        self.steps = step.step + 1
        if self.steps == 1 or self.steps == self.total or now - self.drawn >= self.every_s:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self.drawn, self.drawn_steps = now, self.steps
        done = self.width * self.steps // self.total
        rate = self.tokens / (now - self.start) if now > self.start else 0.0
        bar = "#" * done + "." * (self.width - done)
        self.stream.write(f"\r{self.label}[{bar}] {self.steps}/{self.total} {rate:.0f} tok/s")
        self.stream.flush()

    def close(self) -> None:
        if self.steps:
            if self.drawn_steps != self.steps:  # the rows stopped between two redraws
                self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()


def format_rows(out: Generation, tokenizer: Any) -> list[str]:
    """Each row's new tokens: ids, or text with a tokenizer."""
    if tokenizer is None:
        return [" ".join(map(str, row)) for row in out.tokens]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in out.tokens]


def summary(out: Generation, rows: list[list[int]], first_s: float) -> str:
    batch = len(rows)
    decode_rate = batch * out.steps / out.decode_s if out.decode_s else 0.0
    return (f"batch {batch}, prompt lengths {','.join(str(len(r)) for r in rows)}, new tokens "
            f"{','.join(str(len(t)) for t in out.tokens)}, prefill {1e3 * out.prefill_s:.2f} ms, decode "
            f"{out.decode_ms_per_step:.3f} ms/step ({out.steps} steps), decode {decode_rate:.1f} tok/s, "
            f"end-to-end {out.tokens_per_s:.1f} tok/s, first call {first_s:.2f} s (compile included)")  # fmt: skip


def generate(gen: Generator, rows: list[list[int]], args: argparse.Namespace) -> tuple[Generation, float]:
    """`--repeat` generations; the last one, and the first one's seconds (compile included)."""
    if args.repeat < 1:
        raise GenerationError(f"--repeat must be >= 1, got {args.repeat}")
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    stop = EOS if args.stop_ids is None else parse_ids(args.stop_ids, "--stop-ids")
    show = not args.quiet and (sys.stderr.isatty() or args.max_new_tokens > PROGRESS_OVER)
    first_s = 0.0
    for i in range(args.repeat):
        label = f"run {i + 1}/{args.repeat} " if args.repeat > 1 else ""
        progress = Progress(args.max_new_tokens, sys.stderr, label) if show else None
        start = time.perf_counter()
        out = gen(rows, args.max_new_tokens, sampling, stop, on_tokens=progress)
        if i == 0:
            first_s = time.perf_counter() - start
        if progress is not None:
            progress.close()
    return out, first_s


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        device, dtype = _device_dtype(args)
        model, tokenizer = load_model(args, device, dtype)
        gen = make_generator(model, args)
        rows = prompt_rows(args, gen.vocab, tokenizer)
        gen = fit_cache(gen, args, rows)
        out, first_s = generate(gen, rows, args)
    except GenerationError as e:
        parser.error(str(e))
    for line in format_rows(out, tokenizer):
        print(line)
    what = f"{args.family} {args.size}" if args.family else str(args.checkpoint)
    print(f"{what}, {device.type} {str(dtype).removeprefix('torch.')}, {args.compiler}: {summary(out, rows, first_s)}")
    return 0


if __name__ == "__main__":
    sys.exit(until_reader_leaves(main))
