"""Spec fuzzing (OPGEN_FUZZ_SPEC_MUTATIONS mutations; CI 300, `make fuzz` 10,000), and the bugs it found."""

from __future__ import annotations

from pathlib import Path

import pytest
from children import budget, run_child

from opgen.gen.bindings import c_string
from opgen.spec.kernels import KernelIndex, count_params
from opgen.spec.loader import SpecError
from opgen.spec.validate import load_spec

RELU = "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n"


def test_spec_fuzz() -> None:
    mutations = budget("OPGEN_FUZZ_SPEC_MUTATIONS", 300)
    seed = budget("OPGEN_FUZZ_SEED", 0)
    result = run_child("spec_fuzz.py", f"--mutations={mutations}", f"--seed={seed}", timeout=60 + mutations)
    print(f"spec fuzz: {result.summary}")
    verdict = result.verdict()
    assert verdict is None, verdict
    counts = result.counts()
    assert counts["mutations"] == mutations and counts["spec_error"] > 0 and counts["generated"] > 0, result.summary


def problems_of(tmp_path: Path, data: bytes) -> list[str]:
    path = tmp_path / "spec.yaml"
    path.write_bytes(data)
    with pytest.raises(SpecError) as info:
        load_spec(path, display_name="ops.yaml")
    return info.value.problems


# Found by the spec fuzzer: these escaped as UnicodeDecodeError / yaml.reader.ReaderError tracebacks.
def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    data = RELU.encode() + b"- func: f(Tensor self) -> Tensor\n  doc: '\x85'\n"
    assert problems_of(tmp_path, data) == ["ops.yaml:4: the spec is not valid UTF-8 (byte 0x85)"]


def test_control_character(tmp_path: Path) -> None:
    data = RELU.encode() + b"- func: f(Tensor self) -> Tensor\n  doc: 'a\x00b'\n"
    assert problems_of(tmp_path, data) == ["ops.yaml:4: invalid YAML: character U+0000 is not allowed in YAML"]


# Found by the spec fuzzer: text that reached the generated files and broke them (a NUL byte in the
# stub is a SyntaxError; a carriage return inside a C++ string literal ends the line).
@pytest.mark.parametrize(
    ("field", "problem"),
    [
        ('doc: "a\\0b"', "ops.yaml:3: op 'relu': 'doc' holds the control character U+0000; write printable text"),
        ('doc: "a\\rb"', "ops.yaml:3: op 'relu': 'doc' holds the control character U+000D; write printable text"),
        (
            'out: "relu.out\\0"',
            "ops.yaml:3: op 'relu': 'out' names 'relu.out\\x00', whose overload 'out\\x00' is not a valid name",
        ),
        ('python: "relu\\n"', "ops.yaml:3: op 'relu': python name 'relu\\n' is not a valid Python identifier"),
    ],
)
def test_text_that_broke_generated_files(tmp_path: Path, field: str, problem: str) -> None:
    assert problems_of(tmp_path, (RELU + f"  {field}\n").encode()) == [problem]


def test_c_string_escapes_control_characters() -> None:
    assert c_string('a"b\\c\nd\x00e\r\x7fé') == '"a\\"b\\\\c\\nd\\000e\\015\\177é"'


# Kernels torch lacks, or with another number of arguments, gave C++ that failed in the compiler.
@pytest.mark.skipif(KernelIndex.find() is None, reason="needs torch's headers")
@pytest.mark.parametrize(
    ("kernel", "problem"),
    [
        (
            "at::cpu::relu_nonexistent",
            "cpu kernel 'at::cpu::relu_nonexistent': torch has no header "
            "ATen/ops/relu_nonexistent_cpu_dispatch.h, so no such kernel",
        ),
        ("at::cpu::add", "cpu kernel 'at::cpu::add' takes 3 arguments, but the schema has 1"),
        (
            "at::cpu::relu_x",
            "cpu kernel 'at::cpu::relu_x': torch has no header ATen/ops/relu_x_cpu_dispatch.h, so no such kernel",
        ),
    ],
)
def test_unknown_kernel(tmp_path: Path, kernel: str, problem: str) -> None:
    data = f"- func: relu(Tensor self) -> Tensor\n  kernels: {{cpu: {kernel}}}\n".encode()
    assert problems_of(tmp_path, data) == [f"ops.yaml:1: op 'relu': {problem}"]


@pytest.mark.skipif(KernelIndex.find() is None, reason="needs torch's headers")
def test_kernel_not_declared_in_its_header(tmp_path: Path) -> None:
    inplace = "{func: relu_(Tensor(a!) self) -> Tensor(a!), kernels: {cpu: at::cpu::relu_outf}}"
    data = f"- func: relu(Tensor self) -> Tensor\n  kernels: {{cpu: at::cpu::relu}}\n  inplace: {inplace}\n"
    assert problems_of(tmp_path, data.encode()) == [
        "ops.yaml:3: op 'relu_': cpu kernel 'at::cpu::relu_outf' is not declared in ATen/ops/relu_cpu_dispatch.h "
        "(it declares: relu, relu_)"
    ]


# opgen's own kernels are checked against csrc/opgen/kernels/kernels.h the same way.
@pytest.mark.skipif(KernelIndex.find() is None, reason="needs torch's headers")
@pytest.mark.parametrize(
    ("kernel", "problem"),
    [
        (
            "opgen::kernels::relu",
            "cpu kernel 'opgen::kernels::relu' is not declared in opgen/kernels/kernels.h (it declares: mkl_linear, "
            "mkldnn_convolution_pointwise, mkldnn_convolution_pointwise_binary, mkldnn_linear_pointwise, "
            "mkldnn_linear_pointwise_binary)",
        ),
        (
            "opgen::kernels::mkldnn_linear_pointwise",
            "cpu kernel 'opgen::kernels::mkldnn_linear_pointwise' takes 6 arguments, but the schema has 1",
        ),
    ],
)
def test_unknown_own_kernel(tmp_path: Path, kernel: str, problem: str) -> None:
    data = f"- func: relu(Tensor self) -> Tensor\n  kernels: {{cpu: {kernel}}}\n".encode()
    assert problems_of(tmp_path, data) == [f"ops.yaml:1: op 'relu': {problem}"]


def test_count_params() -> None:
    assert count_params("") == 0
    assert count_params("const at::Tensor & self") == 1
    assert count_params("at::IntArrayRef size, ::std::optional<at::ScalarType> dtype={}, ::std::tuple<int,int> x") == 3
