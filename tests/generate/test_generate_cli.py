"""`python -m opgen.generate` in-process on tiny random models (CPU, 8 new tokens).

Greedy ragged prompts print the Generator's tokens, a seed prints the same samples twice, a saved
checkpoint loads (with its tokenizer where it has one: text in, text out), the cache grows to fit
long prompts, the progress bar shows past 32 tokens, and bad input exits with code 2 and a message.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from opgen.bench.llm_families import causal_lm
from opgen.cli import SIGPIPE_STATUS
from opgen.generate import Generator
from opgen.generate.__main__ import main

pytest.importorskip("transformers")

PROMPTS = [[1, 5, 7, 9, 11], [3, 4]]
NEW = 8


def run(capsys: pytest.CaptureFixture[str], *argv: str, new: int = NEW, quiet: bool = True) -> tuple[list[str], str]:
    """main's stdout: the rows' lines and the summary line."""
    assert main([*argv, "--device", "cpu", "--max-new-tokens", str(new), *(["--quiet"] if quiet else [])]) == 0
    lines = capsys.readouterr().out.splitlines()
    return lines[:-1], lines[-1]


def ids(lines: list[str]) -> list[list[int]]:
    return [[int(v) for v in line.split()] for line in lines]


def prompt_args(prompts: list[list[int]]) -> list[str]:
    return [a for p in prompts for a in ("--prompt-ids", " ".join(map(str, p)))]


def eager(model: torch.nn.Module, prompts: list[list[int]], **kwargs: object) -> list[list[int]]:
    return Generator(model, compiler="eager")(prompts, NEW, **kwargs).tokens  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 saved as a transformers checkpoint folder, without a tokenizer."""
    folder = tmp_path_factory.mktemp("gpt2")
    causal_lm("gpt2").save_pretrained(folder)
    return folder


def test_greedy_ragged_prompt_ids_print_the_generators_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    rows, summary = run(capsys, "--family", "llama", *prompt_args(PROMPTS))  # the opgen compiler
    assert ids(rows) == eager(causal_lm("llama"), PROMPTS)
    assert "batch 2, prompt lengths 5,2," in summary and "tok/s" in summary and "first call" in summary
    chunked, _ = run(capsys, "--family", "llama", "--prefill-chunk", "4", *prompt_args(PROMPTS))
    assert ids(chunked) == ids(rows)  # the prompts as two chunks of 4 (left-padded to 8): the same tokens


def test_a_seed_prints_the_same_samples_twice(capsys: pytest.CaptureFixture[str]) -> None:
    def sample(seed: int, *more: str) -> list[list[int]]:
        args = ("--temperature", "1.0", "--top-k", "50", "--top-p", "0.95", "--seed", str(seed), "--stop-ids", "")
        return ids(run(capsys, "--family", "llama", "--compiler", "eager", *prompt_args(PROMPTS), *args, *more)[0])

    first = sample(3)
    assert sample(3, "--repeat", "2") == first
    assert sample(4) != first
    assert first != eager(causal_lm("llama"), PROMPTS, stop_tokens=())  # sampled, not greedy


def test_random_prompts_of_a_length_and_batch(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--family", "llama", "--compiler", "eager", "--prompt-len", "6", "--batch", "3", "--stop-ids", "")
    rows, summary = run(capsys, *args)
    assert [len(r) for r in ids(rows)] == [NEW] * 3 and "prompt lengths 6,6,6" in summary
    assert ids(run(capsys, *args)[0]) == ids(rows)  # --seed 0 by default


def test_a_checkpoint_folder_loads_and_generates(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, summary = run(capsys, "--checkpoint", str(checkpoint), "--compiler", "eager", *prompt_args(PROMPTS))
    assert ids(rows) == eager(causal_lm("gpt2"), PROMPTS)
    assert str(checkpoint) in summary


def test_a_tokenizer_in_the_folder_takes_and_prints_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    causal_lm("gpt2").save_pretrained(tmp_path)
    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, 256)}}
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    word_level.decoder = tokenizers.decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", eos_token="<eos>")
    tokenizer.save_pretrained(tmp_path)

    rows, _ = run(capsys, "--checkpoint", str(tmp_path), "--compiler", "eager", "--prompt", "w5 w7 w9", "--prompt",
                  "w3 w4")  # fmt: skip
    expected = eager(causal_lm("gpt2"), [[5, 7, 9], [3, 4]])
    assert rows == [tokenizer.decode(t, skip_special_tokens=True) for t in expected]


def test_without_max_cache_the_cache_grows_to_fit_a_long_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    # tiny llama: 128 positions, the Generator's default cache; 125 + 8 needs 133
    rows, summary = run(capsys, "--family", "llama", "--compiler", "eager", "--prompt-len", "125", "--stop-ids", "")
    assert len(ids(rows)[0]) == NEW and "prompt lengths 125," in summary


def test_the_progress_bar_shows_past_32_new_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--family", "llama", "--compiler", "eager", "--device", "cpu", "--prompt-ids", "1 2", "--stop-ids",
                 "", "--max-new-tokens", "40"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "\r[" in err and "40/40" in err and "tok/s" in err and err.endswith("\n")
    run(capsys, "--family", "llama", "--compiler", "eager", "--prompt-ids", "1 2", new=40)  # --quiet
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--family", "llama", "--prompt-ids", "1 2 999"], "got 999"),  # out of the vocabulary of 256
        (["--family", "llama", "--prompt-ids", "1 x"], "token ids are integers"),
        (["--family", "llama", "--prompt", "hello"], "--prompt needs a tokenizer"),
        (["--family", "llama", "--prompt-ids", "1 2", "--batch", "2"], "not with --prompt or --prompt-ids"),
        (["--family", "llama", "--prompt-ids", "1 2 3 4 5", "--max-cache", "10"], "the cache has 10"),
        (["--family", "llama", "--temperature", "-1"], "temperature must be"),
        (["--family", "llama", "--prompt-ids", "1 2", "--prefill-chunk", "4"], "prefill_chunk is opgen's"),
        (["--family", "llama", "--checkpoint", "."], "not allowed with argument --family"),
        (["--prompt-ids", "1 2"], "one of the arguments --family --checkpoint is required"),
        (["--checkpoint", "/no/such/folder"], "--checkpoint /no/such/folder: no such folder"),
    ],
)
def test_bad_input_exits_with_code_2_and_a_message(argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--device", "cpu", "--compiler", "eager", "--max-new-tokens", str(NEW), "--quiet"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "python -m opgen.generate: error:" in err and message in err


def test_prompt_text_needs_a_tokenizer_in_the_folder(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--checkpoint", str(checkpoint), "--device", "cpu", "--prompt", "hello", "--quiet"])
    assert exit_.value.code == 2 and "--prompt needs a tokenizer" in capsys.readouterr().err


def test_a_folder_that_is_no_checkpoint_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--checkpoint", str(tmp_path), "--device", "cpu", "--prompt-ids", "1", "--quiet"])
    assert exit_.value.code == 2 and "not a transformers causal-LM checkpoint" in capsys.readouterr().err


def test_help_runs_as_a_module() -> None:
    done = subprocess.run([sys.executable, "-m", "opgen.generate", "--help"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--checkpoint" in done.stdout and "--max-new-tokens" in done.stdout


def test_a_reader_gone_ends_the_command_quietly(reader_gone: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """`python -m opgen.generate ... | head -1`: SIGPIPE's status and no traceback once the reader has gone."""
    argv = ["--family", "llama", "--device", "cpu", "--compiler", "eager", "--max-new-tokens", "2", "--quiet"]
    done = reader_gone("opgen.generate", *argv)
    assert done.returncode == SIGPIPE_STATUS and "Error" not in done.stderr, done.stderr
