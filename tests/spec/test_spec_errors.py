"""One invalid spec per error case, each with the exact message it must produce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opgen.spec.loader import SpecError
from opgen.spec.validate import load_spec

ROOT = Path(__file__).resolve().parents[2]
RELU = "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n"

# (case id, spec text, every problem the spec must report, in order)
CASES = [
    (
        "yaml_syntax",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::relu\n",
        ["ops.yaml:3: invalid YAML: expected ',' or '}', but got '<stream end>'"],
    ),
    (
        "empty",
        "",
        ["ops.yaml:1: the spec is empty; expected a list of ops"],
    ),
    (
        "top_not_list",
        "func: relu(Tensor self) -> Tensor\n",
        ["ops.yaml:1: the top level must be a list of ops, not a mapping"],
    ),
    (
        "item_not_mapping",
        "- relu\n",
        ["ops.yaml:1: item 1 of the list must be a mapping with a 'func' key, not 'relu'"],
    ),
    (
        "missing_func",
        "- kernels: {cpu: at::cpu::relu}\n",
        ["ops.yaml:1: entry needs a 'func' key holding the op's schema string"],
    ),
    (
        "unknown_key",
        RELU + "  kernel: x\n",
        [
            "ops.yaml:3: op 'relu': unknown key 'kernel' (allowed: func, python, kernels, triton, inplace, out, release_gil, checks, opaque, includes, torch_op, doc); did you mean 'kernels'?"
        ],
    ),
    (
        "null_key",
        RELU + "  null: x\n",
        [
            "ops.yaml:1: op 'relu': unknown key 'None' (allowed: func, python, kernels, triton, inplace, out, release_gil, checks, opaque, includes, torch_op, doc)"
        ],
    ),
    (
        "no_arrow",
        "- func: relu(Tensor self)\n  kernels: {cpu: at::cpu::relu}\n",
        ["ops.yaml:1: op 'relu': schema has no '->' before its returns"],
    ),
    (
        "unknown_type",
        "- func: add.Tensor(Tensor self, Tensor other, *, Scaler alpha=1) -> Tensor\n  kernels: {cpu: at::cpu::add}\n",
        [
            "ops.yaml:1: op 'add.Tensor': arg 'alpha': unknown type 'Scaler' (known: Tensor, int, SymInt, float, bool, Scalar, str, ScalarType, Layout, Device, MemoryFormat)"
        ],
    ),
    (
        "bad_arg_form",
        "- func: relu(Tensor) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n",
        ["ops.yaml:1: op 'relu': argument 'Tensor' is not of the form 'Type name[=default]'"],
    ),
    (
        "duplicate_arg",
        "- func: add.Tensor(Tensor self, Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::add}\n",
        ["ops.yaml:1: op 'add.Tensor': arg 'self' appears twice"],
    ),
    (
        "default_order",
        "- func: f(Tensor self, int a=1, int b) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': arg 'b' has no default but follows 'a', which has one"],
    ),
    (
        "bad_default",
        "- func: f(Tensor self, int a=abc) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': arg 'a': default 'abc' is not a valid int"],
    ),
    (
        "none_default_not_optional",
        "- func: f(Tensor self, int a=None) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': arg 'a': default None needs an optional type ('int?')"],
    ),
    (
        "double_star",
        "- func: f(Tensor self, *, int a, *, int b) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': '*' appears twice"],
    ),
    (
        "unsupported_return",
        "- func: f(Tensor self) -> int\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': return type 'int' is not supported (allowed: Tensor, Tensor[])"],
    ),
    (
        "no_return",
        "- func: f(Tensor self) -> ()\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': an op must return at least one Tensor"],
    ),
    (
        "return_alias_unknown",
        "- func: f(Tensor self) -> Tensor(a)\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': return alias '(a)' refers to no argument"],
    ),
    (
        "missing_kernels",
        "- func: relu(Tensor self) -> Tensor\n",
        ["ops.yaml:1: op 'relu': 'kernels' must map a backend (cpu, cuda, default) to a kernel like at::cpu::add"],
    ),
    (
        "unknown_backend",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {gpu: at::cuda::relu}\n",
        ["ops.yaml:2: op 'relu': unknown backend 'gpu' (allowed: cpu, cuda, default)"],
    ),
    (
        "bad_kernel_form",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: relu}\n",
        [
            "ops.yaml:2: op 'relu': cpu kernel 'relu' is not of the form at::<namespace>::<function>, "
            "opgen::kernels::<function> or <your namespace>::<function> (with 'includes')"
        ],
    ),
    (
        "user_kernel_malformed",
        "- func: f(Tensor self) -> Tensor\n  kernels: {cpu: 'mylib::f()'}\n  includes: [mylib/f.h]\n",
        [
            "ops.yaml:2: op 'f': cpu kernel 'mylib::f()' is not of the form at::<namespace>::<function>, "
            "opgen::kernels::<function> or <your namespace>::<function> (with 'includes')"
        ],
    ),
    (
        "user_kernel_without_includes",
        "- func: f(Tensor self) -> Tensor\n  kernels: {cpu: mylib::f}\n",
        [
            "ops.yaml:2: op 'f': cpu kernel 'mylib::f' is a user kernel: name the headers that declare it in "
            "'includes' (like includes: [mylib/ops.h])"
        ],
    ),
    (
        "includes_without_user_kernels",
        RELU + "  includes: [mylib/relu.h]\n",
        [
            "ops.yaml:3: op 'relu': 'includes' is only for user kernels (ATen's and opgen's headers are included "
            "already)"
        ],
    ),
    (
        "includes_not_a_list",
        "- func: f(Tensor self) -> Tensor\n  kernels: {cpu: mylib::f}\n  includes: mylib/f.h\n",
        ["ops.yaml:3: op 'f': 'includes' must be a list of header names (like [mylib/ops.h]), not 'mylib/f.h'"],
    ),
    (
        "includes_bad_headers",
        "- func: f(Tensor self) -> Tensor\n  kernels: {cpu: mylib::f}\n  includes: [../f.h, /usr/f.h, mylib/f.cpp, 'f.h>']\n",
        [
            f"ops.yaml:3: op 'f': 'includes': {h!r} is not a header name: a relative path ending in .h, .hpp, "
            ".cuh or .hh, without '..'"
            for h in ("../f.h", "/usr/f.h", "mylib/f.cpp", "f.h>")
        ],
    ),
    (
        "variant_user_kernel_without_includes",
        RELU + "  out: {func: relu.out, kernels: {cpu: mylib::relu_out}}\n",
        [
            "ops.yaml:3: op 'relu': 'out': user kernels need 'includes' on the entry, naming the headers that declare them"
        ],
    ),
    (
        "torch_op_malformed",
        "- func: f(Tensor self) -> Tensor\n  kernels: {cpu: mylib::f}\n  includes: [mylib/f.h]\n  torch_op: mylib.f\n",
        [
            "ops.yaml:4: op 'f': 'torch_op' must be ns::name or ns::name.overload (like mylib::scaled_add), not 'mylib.f'"
        ],
    ),
    (
        "torch_op_without_user_kernels",
        RELU + "  torch_op: mylib::relu\n",
        ["ops.yaml:3: op 'relu': 'torch_op' is only for entries with user kernels (an ATen op is named by its schema)"],
    ),
    (
        "torch_op_clash",
        "- func: f(Tensor self) -> Tensor\n  kernels: {cpu: mylib::f}\n  includes: [mylib/f.h]\n  torch_op: mylib::f\n"
        "- func: g(Tensor self) -> Tensor\n  kernels: {cpu: mylib::g}\n  includes: [mylib/f.h]\n  torch_op: mylib::f.default\n",
        ["ops.yaml:5: op 'g': op 'mylib::f' is already bound by 'f' (line 1); each torch_op names one entry"],
    ),
    (
        "torch_op_clash_with_aten",
        RELU + "- func: my_relu(Tensor self) -> Tensor\n  kernels: {cpu: mylib::relu}\n  includes: [mylib/relu.h]\n"
        "  torch_op: aten::relu\n",
        [
            "ops.yaml:3: op 'my_relu': op 'aten::relu' is already bound by 'relu' (line 1); each torch_op names one entry"
        ],
    ),
    (
        "unknown_namespace",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::native::relu}\n",
        [
            "ops.yaml:2: op 'relu': cpu kernel 'at::native::relu': unknown namespace (allowed: at::cpu, at::cuda, at::compositeexplicitautograd, at::compositeexplicitautogradnonfunctional, at::compositeimplicitautograd, opgen::kernels)"
        ],
    ),
    (
        "own_kernel_other_namespace",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: opgen::checks::relu}\n",
        [
            "ops.yaml:2: op 'relu': cpu kernel 'opgen::checks::relu' is not of the form at::<namespace>::<function>, "
            "opgen::kernels::<function> or <your namespace>::<function> (with 'includes')"
        ],
    ),
    (
        "opaque_with_aten_kernel",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n  opaque: [self]\n",
        ["ops.yaml:3: op 'relu': 'opaque' needs opgen::kernels kernels: ATen's kernels take strided tensors only"],
    ),
    (
        "opaque_not_a_tensor_argument",
        "- func: relu(Tensor self, int n) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n  opaque: [n]\n",
        ["ops.yaml:3: op 'relu': 'opaque' must be a list of Tensor argument names (self), not ['n']"],
    ),
    (
        "own_kernel_for_cuda",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cuda: opgen::kernels::relu}\n",
        ["ops.yaml:2: op 'relu': cuda kernel 'opgen::kernels::relu': opgen::kernels kernels cannot serve 'cuda'"],
    ),
    (
        "backend_namespace_mismatch",
        "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cuda::relu}\n",
        ["ops.yaml:2: op 'relu': cpu kernel 'at::cuda::relu': at::cuda kernels cannot serve 'cpu'"],
    ),
    (
        "bad_python_name",
        RELU + "  python: 2relu\n",
        ["ops.yaml:3: op 'relu': python name '2relu' is not a valid Python identifier"],
    ),
    (
        "reserved_python_name",
        RELU + "  python: get_kernel_op_info\n",
        ["ops.yaml:3: op 'relu': python name 'get_kernel_op_info' is reserved for the registry functions"],
    ),
    (
        "duplicate_python_name",
        RELU + "- func: relu.x(Tensor self) -> Tensor\n  python: relu\n  kernels: {cpu: at::cpu::relu}\n",
        [
            "ops.yaml:3: op 'relu.x': python name 'relu' is already used by 'relu' (line 1); set 'python:' to another name"
        ],
    ),
    (
        "duplicate_schema",
        RELU + RELU,
        ["ops.yaml:3: op 'relu': schema 'relu' is already declared on line 1"],
    ),
    (
        "release_gil_not_bool",
        RELU + "  release_gil: yes please\n",
        ["ops.yaml:3: op 'relu': 'release_gil' must be true or false, not 'yes please'"],
    ),
    (
        "checks_not_list",
        RELU + "  checks: batch_norm_channels\n",
        [
            "ops.yaml:3: op 'relu': 'checks' must be a list of check names (known: batch_norm_channels, fft_dims, batch_norm_out_contiguous, linear_binary_other, conv_binary_other, attention_inputs, cudnn_attention_head_dim), not 'batch_norm_channels'"
        ],
    ),
    (
        "checks_unknown",
        RELU + "  checks: [batch_norm_chanels]\n",
        [
            "ops.yaml:3: op 'relu': unknown check 'batch_norm_chanels' (known: batch_norm_channels, fft_dims, batch_norm_out_contiguous, linear_binary_other, conv_binary_other, attention_inputs, cudnn_attention_head_dim); did you mean 'batch_norm_channels'?"
        ],
    ),
    (
        "checks_missing_arguments",
        RELU + "  checks: [batch_norm_channels]\n",
        [
            "ops.yaml:3: op 'relu': check 'batch_norm_channels' takes the arguments (Tensor input, Tensor? weight, "
            "Tensor? bias, Tensor running_mean, Tensor running_var); the schema lacks Tensor input, Tensor? weight, "
            "Tensor? bias, Tensor running_mean, Tensor running_var"
        ],
    ),
    (
        "checks_argument_of_another_type",
        "- func: bn(Tensor input, int weight, Tensor? bias, Tensor running_mean, Tensor running_var) -> Tensor\n"
        "  kernels: {cpu: at::cpu::bn}\n  checks: [batch_norm_channels]\n",
        [
            "ops.yaml:3: op 'bn': check 'batch_norm_channels' takes the arguments (Tensor input, Tensor? weight, "
            "Tensor? bias, Tensor running_mean, Tensor running_var); the schema lacks Tensor? weight"
        ],
    ),
    (
        "variant_check_its_schema_lacks",
        RELU + "  inplace: {func: relu_, checks: [batch_norm_out_contiguous]}\n",
        [
            "ops.yaml:3: op 'relu': 'inplace': check 'batch_norm_out_contiguous' takes the arguments (Tensor input, "
            "bool training); the schema lacks Tensor input, bool training"
        ],
    ),
    (
        "doc_not_string",
        RELU + "  doc: [a, b]\n",
        ["ops.yaml:3: op 'relu': 'doc' must be a string"],
    ),
    (
        "inplace_bad_name",
        RELU + "  inplace: relu.inplace\n",
        ["ops.yaml:3: op 'relu': inplace variant 'relu.inplace' must be named 'relu_.<overload>'"],
    ),
    (
        "inplace_no_self",
        "- func: zeros(int[] size) -> Tensor\n  kernels: {default: at::compositeexplicitautograd::zeros}\n  inplace: zeros_\n",
        ["ops.yaml:3: op 'zeros': an inplace variant needs 'Tensor self' as the first argument"],
    ),
    (
        "out_multi_return",
        "- func: max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)\n  kernels: {cpu: at::cpu::max}\n  out: max.dim_max\n",
        [
            "ops.yaml:3: op 'max.dim': 'out: max.dim_max' can only be derived for an op returning one Tensor; write its schema in full"
        ],
    ),
    (
        "out_wrong_kind",
        RELU + "  out: {func: 'relu(Tensor self) -> Tensor'}\n",
        ["ops.yaml:3: op 'relu': 'out' schema 'relu' is not an out schema"],
    ),
    (
        "variant_unknown_key",
        RELU + "  out: {func: relu.out, kernel: x}\n",
        [
            "ops.yaml:3: op 'relu': 'out': unknown key 'kernel' (allowed: func, python, kernels, checks); did you mean 'kernels'?"
        ],
    ),
    (
        "list_of_str",
        "- func: f(Tensor self, str[] names) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        [
            "ops.yaml:1: op 'f': arg 'names': lists of 'str' are not supported (allowed: Tensor, int, SymInt, float, bool)"
        ],
    ),
    (
        "list_of_bool_without_size",
        "- func: f(Tensor self, bool[] mask) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': arg 'mask': a list of bools needs a fixed size and no '?' ('bool[3]', not 'bool[]')"],
    ),
    (
        "written_optional",
        "- func: f(Tensor(a!)? self) -> Tensor(a!)\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': arg 'self': only a plain Tensor can be written ('Tensor?')"],
    ),
    (
        "alias_on_int",
        "- func: f(Tensor self, int(a) x) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': arg 'x': type 'int(a)': only Tensor types take an alias annotation"],
    ),
    (
        "bad_op_name",
        "- func: 3f(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op '3f': '3f' is not a valid op name"],
    ),
    (
        "keyword_arg_name",
        "- func: f(Tensor self, int lambda) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': 'lambda' is not a valid argument name"],
    ),
    (
        "write_disagree",
        "- func: f(Tensor(a!) self) -> Tensor(a)\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': return alias '(a)' and arg 'self' disagree on '!'"],
    ),
    (
        "unbalanced",
        "- func: f(Tensor self, int[2 x) -> Tensor\n  kernels: {cpu: at::cpu::f}\n",
        ["ops.yaml:1: op 'f': unbalanced brackets or quotes in 'Tensor self, int[2 x'"],
    ),
]


@pytest.mark.parametrize(("text", "problems"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_spec_reports_exact_problems(tmp_path: Path, text: str, problems: list[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path, display_name="ops.yaml")
    assert info.value.problems == problems


def test_cases_are_distinct() -> None:
    assert len(CASES) >= 20
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len({tuple(c[2]) for c in CASES}) == len(CASES)


def test_every_problem_of_a_spec_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "- func: f(Tensor self, Scaler x) -> Tensor\n"
        "  kernels: {cpu: at::cpu::f}\n"
        "- func: g(Tensor self) -> Tensor\n"
        "  kernels: {gpu: at::cpu::g}\n"
        "  colour: red\n"
    )
    with pytest.raises(SpecError) as info:
        load_spec(path, display_name="ops.yaml")
    assert [p.split(":")[1] for p in info.value.problems] == ["1", "5", "4"]
    assert str(info.value).startswith("3 problems in the op spec:\n")


@pytest.mark.parametrize("command", ["check", "gen"])
def test_cli_reports_problems_without_traceback(tmp_path: Path, command: str) -> None:
    spec = tmp_path / "my_ops.yaml"
    spec.write_text("- func: f(Tensor self) -> int\n  kernels: {cpu: at::cpu::f}\n")
    extra = ["--out", str(tmp_path / "out")] if command == "gen" else []
    result = subprocess.run(
        [sys.executable, "-m", "opgen", command, "--spec", str(spec), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "my_ops.yaml:1: op 'f': return type 'int' is not supported (allowed: Tensor, Tensor[])" in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_reports_missing_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "opgen", "check", "--spec", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "nope.yaml: cannot read the spec: No such file or directory" in result.stderr
