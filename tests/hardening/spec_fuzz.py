"""Spec fuzzing: mutations of valid `ops.yaml` files through the loader, validator and emitter.

Every mutation must give either generated files or a `SpecError` whose every problem starts with
`<file>:<line>: `. Anything else is a failure (a `FAIL` line; exit status 1):
- `traceback`: any other exception escaped `load_spec` or `emit`;
- `no-location`: a SpecError problem without `file:line:`;
- `bad-output`: an accepted spec whose output would not reach a working build: a kernel that torch's
  headers do not declare with the schema's number of arguments (it would fail in the C++
  compiler), a stub that is not valid Python, or a C++ comment or raw string that the spec's text
  breaks open.

    python tests/hardening/spec_fuzz.py --mutations 300 [--seed 0]
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import yaml

from opgen.gen.emit import emit
from opgen.spec.kernels import KernelIndex
from opgen.spec.loader import SpecError
from opgen.spec.validate import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "ops.yaml"
LOCATION = re.compile(r"^[^\n:]+:\d+: ")
ODD = ("\u00e9", "\u202e", "\ufeff", "\U0001f600", "\x00", "\t", "\r", "\u2028", "\\", '"', "'", ')opgen"', "*/", "{{")
SCHEMA_PIECES = (
    "Tensor",
    "Tensor?",
    "Tensor(a!)",
    "int",
    "int[2]",
    "SymInt[]",
    "Scalar",
    "float",
    "bool",
    "str",
    "Scaler",
    "*",
    ",",
    "(",
    ")",
    "->",
    "=",
    "[",
    "]",
    "?",
    "!",
    "self",
    "out",
    "a",
    ".",
    " ",
    "None",
)


def entries_text() -> list[str]:
    """ops.yaml split into its entries' text (each starts with `- func:`), comments dropped."""
    text = SPEC.read_text()
    parts = re.split(r"(?m)^(?=- func:)", text)
    return [p for p in parts if p.startswith("- func:")]


def mutate(rng: random.Random, entries: list[str]) -> tuple[str, bytes]:
    """(what was done, the mutated file's bytes)."""
    chosen = rng.sample(entries, rng.randint(1, 6)) if rng.random() < 0.97 else list(entries)
    kind = rng.choice(("structured",) * 6 + ("text",) * 3 + ("bytes", "huge"))
    if kind == "structured":
        data = yaml.safe_load("".join(chosen))
        what = structured(rng, data)
        return f"structured {what}", yaml.safe_dump(data, allow_unicode=rng.random() < 0.5, sort_keys=False).encode()
    text = "".join(chosen)
    if kind == "text":
        return "text", text_edit(rng, text).encode("utf-8", "surrogatepass")
    if kind == "bytes":
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return "bytes", bytes(data)
    copies = rng.choice((20, 200))
    if rng.random() < 0.5:
        return f"huge x{copies}", ("".join(chosen[:2]) * copies).encode()
    return "huge doc", (chosen[0].rstrip("\n") + f"\n  doc: '{'x' * 2_000_000}'\n").encode()


def structured(rng: random.Random, data: list) -> str:
    entry = rng.choice(data)
    key = rng.choice(list(entry))
    actions = ("drop", "type", "unknown", "schema", "kernel", "duplicate", "unicode", "variant", "python")
    action = rng.choice(actions + (("triton",) * 4 if isinstance(entry.get("triton"), dict) else ()))
    match action:
        case "triton":
            return f"triton {triton_edit(rng, entry['triton'])}"
        case "drop":
            del entry[key]
        case "type":
            entry[key] = rng.choice((None, 1, 2.5, True, [], ["x"], {"cpu": 1}, {"a": {"b": []}}, "", -1))
        case "unknown":
            entry[rng.choice(("kernel", "funcs", "Func", "\u00e9", "", "1"))] = "x"
        case "schema":
            entry["func"] = schema_edit(rng, str(entry.get("func", "")))
        case "kernel":
            entry["kernels"] = rng.choice(
                (
                    {"cpu": "at::cpu::no_such_kernel"},
                    {"cpu": "at::cpu::mul"},
                    {"cpu": "at::cpu::add_out"},
                    {"cuda": "at::cpu::add"},
                    {"tpu": "at::cpu::add"},
                    {"cpu": "at::compositeexplicitautograd::add"},
                    {"cpu": "at::cpu::" + rng.choice(("", "1x", "add-sub", "add;", "_softmax"))},
                    {"cpu": "add"},
                    {"cpu": ["at::cpu::add"]},
                    "at::cpu::add",
                )
            )
        case "duplicate":
            data.append(dict(entry))
        case "unicode":
            if isinstance(entry.get(key), str):
                s = entry[key]
                i = rng.randrange(len(s) + 1)
                entry[key] = s[:i] + rng.choice(ODD) + s[i:]
        case "variant":
            entry[rng.choice(("inplace", "out"))] = rng.choice(
                ("add_.Tensor", "add.out", "nope", "", {"func": "x.out(Tensor self) -> Tensor"}, {"python": "1"}, 3)
            )
        case "python":
            entry["python"] = rng.choice(("class", "get_kernel_op_info", "add", "x y", "\u00e9t\u00e9", "_", "a" * 300))
    return f"{action} {key}"


def schema_edit(rng: random.Random, schema: str) -> str:
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(schema) + 1)
        match rng.randrange(3):
            case 0:
                schema = schema[:i] + schema[i + rng.randint(1, 5) :]
            case 1:
                schema = schema[:i] + rng.choice(SCHEMA_PIECES + ODD) + schema[i:]
            case _:
                for old, new in (("Tensor", "Scalar"), ("int", "float"), ("self", "other"), ("->", "")):
                    if old in schema and rng.random() < 0.5:
                        schema = schema.replace(old, new, 1)
    return schema


def text_edit(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 5)):
        i = rng.randrange(len(text) + 1)
        match rng.randrange(5):
            case 0:
                text = text[:i] + text[i + rng.randint(1, 20) :]
            case 1:
                extra = ("\n", "  ", ":", "- ", "{", "[", "&a", "*a", "!!python/object", "\udc80")
                text = text[:i] + rng.choice(ODD + extra) + text[i:]
            case 2:
                lines = text.splitlines(keepends=True) or [""]  # an earlier edit may have emptied it
                j = rng.randrange(len(lines))
                lines.insert(j, lines[j])
                text = "".join(lines)
            case 3:
                text = text[:i]
            case _:
                text = text.replace("  ", "\t", 1)
    return text


def check_output(files: dict[str, str], ops: tuple, index: KernelIndex | None) -> str | None:
    try:
        ast.parse(files["kernel_ops.pyi"])
    except SyntaxError as exc:
        return f"the stub is not valid Python: {exc}"
    for name, text in files.items():
        if name.endswith(".cpp"):
            problem = cpp_lexical_problem(text)
            if problem:
                return f"{name}: {problem}"
    if index is not None:
        for op in ops:
            for kernel in op.kernels:
                problem = index.problem(kernel, len(op.schema.args))
                if problem:
                    return f"{op.python_name}: {problem}"
    return None


TRITON_VALUES = (
    None, 1, 2**70, -1, 2.5, True, "", "x", "self", "out", "numel(self)", "cdiv(n, 0)", "size(self, 2**64)",
    "1 +", "max(1)", "out // 0", [], ["x"], [1, 2, 3, 4], [{"BLOCK": 1}], [{"num_warps": 3}], [{"n_elements": 1}],
    {}, {"a": "self"}, {"out": "empty_like(other, dtype=int64)"}, {"out": "empty_like(alpha)"}, "aten.add",
    "a.b:c", "\u00e9", "x )opgen\"", [7],
)  # fmt: skip


def triton_edit(rng: random.Random, section: dict) -> str:
    """Change, drop or add a key of a `triton:` section, or one entry of its args/outputs/configs."""
    key = rng.choice([*section, "gird"])
    target = section.get(key)
    if isinstance(target, dict) and target and rng.random() < 0.5:
        inner = rng.choice(list(target))
        target[inner] = rng.choice(TRITON_VALUES)
        return f"{key}.{inner}"
    if isinstance(target, list) and target and rng.random() < 0.5:
        target[rng.randrange(len(target))] = rng.choice(TRITON_VALUES)
        return f"{key}[]"
    if rng.random() < 0.2:
        section.pop(key, None)
        return f"drop {key}"
    section[key] = rng.choice(TRITON_VALUES)
    return key


def cpp_lexical_problem(text: str) -> str | None:
    """What would break the generated C++ before any type checking: a comment or string literal that
    the spec's text ends early or joins to the next line, or a raw string opened and not closed."""
    if text.count('R"opgen(') != text.count(')opgen"'):
        return "a raw string is broken open"
    for line in text.split("\n"):  # not splitlines(): C++ does not end lines at U+2028 and the like
        if line.rstrip().endswith("\\"):
            return f"a line ending in a backslash joins the next one: {line[:200]!r}"
        if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line):
            return f"a raw control character: {line[:200]!r}"
        if line.lstrip().startswith("//") or 'R"opgen(' in line:
            continue
        quotes = len(re.findall(r'(?<!\\)(?:\\\\)*"', line))
        if quotes % 2:
            return f"a string literal is not closed on its line: {line[:200]!r}"
    return None


def run_one(what: str, data: bytes, folder: Path, index: KernelIndex | None, tally: Counter) -> str | None:
    path = folder / "ops.yaml"
    path.write_bytes(data)
    try:
        ops = load_spec(path)
        files = emit(ops, "ops.yaml")
    except SpecError as exc:
        tally["spec_error"] += 1
        bad = [p for p in exc.problems if not LOCATION.match(p)]
        return f"no-location {what}: {bad[0][:300]!r}" if bad else None
    except Exception:
        return f"traceback {what}: {traceback.format_exc()[-1500:]}"
    tally["generated"] += 1
    problem = check_output(files, ops, index)
    return f"bad-output {what}: {problem}" if problem else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    rng, entries, tally = random.Random(options.seed), entries_text(), Counter()
    index = KernelIndex.find()
    failures, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(options.mutations):
            what, data = mutate(rng, entries)
            print(f"CALL mutation {n}: {what}", flush=True)
            problem = run_one(what, data, Path(tmp), index, tally)
            tally["mutations"] += 1
            if problem:
                failures += 1
                print(f"FAIL {problem}", flush=True)
    counts = " ".join(f"{k}={v}" for k, v in sorted(tally.items()))
    print(f"DONE {counts} failures={failures} seconds={time.perf_counter() - start:.1f}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
