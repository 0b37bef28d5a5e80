"""The C++ program's grammar (docs/cpp-program.md), round trip: what codegen/cpp.py prints, the executor's
parser reads and its printer (`_C.reprint_program`) writes back unchanged. Covers every runtime case, every
zoo model (with the `zoo` extra), a dynamic-shapes program, a fused kernel's externs and alternatives,
literals of every kind and the doc's example.
"""

from __future__ import annotations

import random
import struct
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from runtime_cases import CASES

import opgen
from opgen import _C
from opgen.runtime.codegen.cpp_literals import literal_text
from opgen.runtime.ir import Sym

try:
    from opgen.bench.zoo_models import ZOO
except ImportError:  # the zoo extra (transformers) is not installed
    ZOO = ()

ROOT = Path(__file__).resolve().parents[2]
NO_ZOO = pytest.param("zoo", marks=pytest.mark.skip(reason="needs the zoo extra (transformers)"))


def cpp_program(fn: Any) -> str:
    """The program text a compiled function runs: the one place that knows where the artifact keeps it."""
    return fn.artifact.cpp_program


def significant(text: str) -> str:
    """`text` less what docs/cpp-program.md calls insignificant: whole-line comments besides the header."""
    first, *rest = text.split("\n")
    return "\n".join([first, *(line for line in rest if not line.lstrip().startswith("#"))])


def assert_round_trip(text: str) -> None:
    again = _C.reprint_program(text)
    if again != significant(text):
        want, got = significant(text).splitlines(), again.splitlines()
        diff = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
        pytest.fail(f"line {diff + 1} printed {want[diff : diff + 1]}, reprinted {got[diff : diff + 1]}")
    assert _C.reprint_program(again) == again  # canonical: reprinting changes nothing more


def compiled_program(model: torch.nn.Module, inputs: tuple[Any, ...], **options: Any) -> str:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = opgen.compile(model, inputs, backend="cpp", **options)
    text = cpp_program(fn)
    if not text:
        pytest.skip(f"the cpp backend printed no program: {fn.report()}")
    return text


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_runtime_case_round_trips(case: Any) -> None:
    assert_round_trip(compiled_program(case.model(), case.inputs()))


@pytest.mark.parametrize("name", [m.name for m in ZOO] or [NO_ZOO])
def test_zoo_model_round_trips(name: str) -> None:
    model, inputs = next(m for m in ZOO if m.name == name).build()
    assert_round_trip(compiled_program(model, inputs))


def test_dynamic_shapes_round_trip() -> None:
    """`?` sizes, `size` and `sym` lines, lists built per call."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
    dims = {"input": {0: torch.export.Dim("n", min=2, max=64)}}
    text = compiled_program(model, (torch.randn(8, 4),), dynamic_shapes=dims)
    assert "?" in text and " = size " in text
    assert_round_trip(text)


class Pointwise(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 2 + y, approximate="tanh").relu() * 0.5


def test_fused_kernels_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """`extern` and `call` lines and `alternative` sections, as a fused kernel prints them (fused as on CUDA)."""
    from fusion_interp import compile_fused

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = (torch.randn(4, 16), torch.randn(16))
        fn, _ = compile_fused(monkeypatch, Pointwise(), inputs, run_triton=False, backend="cpp")
    text = cpp_program(fn)
    assert "\nalternative fused0 triton\n" in text and " = call fused0 " in text
    assert_round_trip(text)


def _floats() -> list[float]:
    rng = random.Random(0)
    spread = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(300)]
    scales = [rng.uniform(-10, 10) * 10.0**e for e in range(-12, 24) for _ in range(3)]
    edges = [0.0, -0.0, 0.1, 1e-05, 1e-4, 1e16, 1e15, 123.0, 2.5, 5e-324, 1.7976931348623157e308]
    return [*edges, float("inf"), float("-inf"), float("nan"), *spread, *scales]


def test_literals_of_every_kind_round_trip() -> None:
    """Each literal as codegen/cpp_literals.py prints it comes back as it was printed (floats as Python's repr)."""
    syms = [Sym("dtype", d) for d in ("float32", "bfloat16", "int64", "bool", "complex64")]
    syms += [Sym("device", "cpu"), Sym("device", "cuda:1"), Sym("layout", "strided")]
    syms += [Sym("memory_format", m) for m in ("contiguous_format", "preserve_format", "channels_last")]
    values: list[Any] = [None, True, False, 0, -3, 2**63 - 1, "tanh", "", "a b#c'%", "ünï", *syms, *_floats()]
    values += [(4, 16), (True, False), (0.5, 2.0), (1, 2.5), (), ("a", None), (True, 1)]
    operands = " ".join(literal_text(v) for v in values)
    head = "# @generated by opgen: literals. Do not edit.\nprogram f registers 1 statics 0\n"
    assert_round_trip(f"{head}input r0 x float32 cpu [1] [1]\nsetup:\nbody:\n  return tuple {operands}\n")


def test_the_docs_example_round_trips() -> None:
    doc = (ROOT / "docs" / "cpp-program.md").read_text()
    example = doc.split("\n## Example\n", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert_round_trip(example)


def test_whole_line_comments_are_all_it_drops() -> None:
    head = "# @generated by opgen. Do not edit.\nprogram f registers 2 statics 0\n"
    text = f"{head}input r0 x float32 cpu [4] [1]\nsetup:\nbody:\n  # a note\n  r1 = relu.cpu r0  # relu\n"
    assert _C.reprint_program(text + "  return single r1\n") == significant(text) + "  return single r1\n"
    with pytest.raises(ValueError, match="line 7: no thunk for nope on cpu"):
        _C.reprint_program(text.replace("relu.cpu", "nope.cpu"))
