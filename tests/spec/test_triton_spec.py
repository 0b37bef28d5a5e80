"""Triton ops in the spec: one invalid `triton:` section per error case, with its exact message."""

from __future__ import annotations

from pathlib import Path

import pytest

from opgen.jit.expr import TensorProp
from opgen.spec.loader import SpecError
from opgen.spec.model import OpSpec, TritonConfig, Variant
from opgen.spec.validate import load_spec

# A valid Triton op, one key a line (line 1: func, 2: triton, 3: kernel, 4: args, 5: outputs,
# 6: grid, 7: configs); each case replaces, drops or adds lines.
FUNC = "tadd(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
LINES = {
    "func": f"- func: {FUNC}",
    "triton": "  triton:",
    "kernel": "    kernel: pkg.kernels:add_kernel",
    "args": "    args: {x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self), alpha: alpha}",
    "outputs": "    outputs: {out: empty_like(self)}",
    "grid": "    grid: ['cdiv(n, BLOCK)']",
    "configs": "    configs: [{BLOCK: 1024}]",
}


def spec(extra: str = "", **replace: str | None) -> str:
    """The valid op with some lines replaced (None drops a line) and `extra` lines appended."""
    lines = [replace.get(key, text) for key, text in LINES.items()]
    return "\n".join(line for line in lines if line is not None) + "\n" + extra


def func(text: str) -> str:
    return f"- func: {text}"


def args(text: str) -> str:
    return f"    args: {{{text}}}"


INPLACE = func("tadd_(Tensor(a!) self, Tensor other) -> Tensor(a!)")
INPLACE_ARGS = args("x_ptr: self, y_ptr: other, out_ptr: self, n: numel(self)")

# (case id, spec text, every problem the spec must report, in order)
CASES = [
    (
        "not_mapping",
        spec(triton="  triton: add_kernel", kernel=None, args=None, outputs=None, grid=None, configs=None),
        [
            "ops.yaml:2: op 'tadd': 'triton' must be a mapping with kernel, args, grid and configs",
        ],
    ),
    (
        "with_kernels",
        spec("  kernels: {cpu: at::cpu::add}\n"),
        [
            "ops.yaml:8: op 'tadd': give either 'kernels' (ATen kernels) or 'triton', not both",
        ],
    ),
    (
        "with_inplace",
        spec("  inplace: tadd_\n"),
        [
            "ops.yaml:8: op 'tadd': a Triton op has no 'inplace' variant; declare it as an entry of its own with a Tensor(a!) schema",
        ],
    ),
    (
        "with_release_gil",
        spec("  release_gil: true\n"),
        [
            "ops.yaml:8: op 'tadd': a Triton op keeps the GIL while it launches: remove 'release_gil'",
        ],
    ),
    (
        "unknown_key",
        spec("    gird: [1]\n"),
        [
            "ops.yaml:8: op 'tadd': triton: unknown key 'gird' (allowed: kernel, args, outputs, grid, configs, candidate_for, contiguous, same_shape); did you mean 'grid'?",
        ],
    ),
    (
        "missing_key",
        spec(configs=None),
        [
            "ops.yaml:2: op 'tadd': triton: missing key 'configs'",
        ],
    ),
    (
        "bad_kernel",
        spec(kernel="    kernel: add_kernel"),
        [
            "ops.yaml:3: op 'tadd': triton: kernel 'add_kernel' is not of the form 'module.path:function' (a @triton.jit function)",
        ],
    ),
    (
        "args_not_mapping",
        spec(args="    args: [self, other]"),
        [
            "ops.yaml:4: op 'tadd': triton: 'args' must map each runtime parameter of the kernel, in its order, to an expression",
        ],
    ),
    (
        "args_bad_param",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, 1n: numel(self)")),
        [
            "ops.yaml:4: op 'tadd': triton: args: parameter name '1n' is not a valid identifier",
            "ops.yaml:6: op 'tadd': triton: grid[0]: 'n' is neither a kernel parameter (a key of 'args') nor an int constexpr of every config",
        ],
    ),
    (
        "args_parse",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self) ** 2")),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'n': 'numel(self) ** 2' is not allowed in 'numel(self) ** 2' (allowed: ints, names, + - * //, numel(t), size(t, d), stride(t, d), cdiv(a, b), max(a, b), min(a, b))",
        ],
    ),
    (
        "args_float_literal",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self), s: 0.5")),
        [
            "ops.yaml:4: op 'tadd': triton: args: 's': expected an expression (a string or an int), got float",
        ],
    ),
    (
        "args_unknown_name",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(slf)")),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'n': unknown name 'slf' (known: self, other, alpha, out)",
        ],
    ),
    (
        "args_list_type",
        spec(
            func=func("tadd(Tensor self, Tensor other, int[] dims) -> Tensor"),
            args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self), d: dims"),
        ),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'd': arg 'dims' of type 'int[]' cannot be passed (Tensor, int, SymInt, float, bool, Scalar, each also optional)",
        ],
    ),
    (
        "args_scalar_in_expr",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self) * alpha")),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'n': 'alpha' is a 'Scalar'; expressions compute with int arguments",
        ],
    ),
    (
        "args_tensor_in_expr",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self) + other")),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'n': 'other' is a 'Tensor'; expressions compute with int arguments",
        ],
    ),
    (
        "args_numel_of_optional",
        spec(
            func=func("tadd(Tensor self, Tensor other, Tensor? w=None) -> Tensor"),
            args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(w)"),
        ),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'n': numel/size/stride need a Tensor, and 'w' is a 'Tensor?'",
        ],
    ),
    (
        "args_numel_of_int",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(alpha)")),
        [
            "ops.yaml:4: op 'tadd': triton: args: 'n': numel/size/stride need a Tensor, and 'alpha' is a 'Scalar'",
        ],
    ),
    (
        "args_int_too_big",
        spec(args=args("x_ptr: self, y_ptr: other, out_ptr: out, n: numel(self), k: 9223372036854775808")),
        ["ops.yaml:4: op 'tadd': triton: args: 'k': 9223372036854775808 does not fit in a 64-bit int"],
    ),
    (
        "grid_dim_too_big",
        spec(grid="    grid: ['size(x_ptr, 99999999999999999999)']"),
        ["ops.yaml:6: op 'tadd': triton: grid[0]: 99999999999999999999 does not fit in a 64-bit int"],
    ),
    (
        "grid_empty",
        spec(grid="    grid: []"),
        [
            "ops.yaml:6: op 'tadd': triton: 'grid' must be a list of 1 to 3 expressions, not []",
        ],
    ),
    (
        "grid_too_long",
        spec(grid="    grid: [1, 1, 1, 1]"),
        [
            "ops.yaml:6: op 'tadd': triton: 'grid' must be a list of 1 to 3 expressions, not [1, 1, 1, 1]",
        ],
    ),
    (
        "grid_unknown_name",
        spec(grid="    grid: ['cdiv(n, BLOK)']"),
        [
            "ops.yaml:6: op 'tadd': triton: grid[0]: 'BLOK' is neither a kernel parameter (a key of 'args') nor an int constexpr of every config",
        ],
    ),
    (
        "grid_constexpr_not_everywhere",
        spec(configs="    configs: [{BLOCK: 1024}, {B: 256}]"),
        [
            "ops.yaml:6: op 'tadd': triton: grid[0]: 'BLOCK' is neither a kernel parameter (a key of 'args') nor an int constexpr of every config",
        ],
    ),
    (
        "grid_constexpr_not_int",
        spec(configs="    configs: [{BLOCK: '1024'}]"),
        [
            "ops.yaml:6: op 'tadd': triton: grid[0]: constexpr 'BLOCK' is not an int in every config",
        ],
    ),
    (
        "grid_numel_of_int",
        spec(grid="    grid: ['numel(n)']"),
        [
            "ops.yaml:6: op 'tadd': triton: grid[0]: numel/size/stride need a tensor parameter, and 'n' is not one",
        ],
    ),
    (
        "grid_unquoted_comma",
        spec(grid="    grid: [cdiv(n, BLOCK)]"),
        [
            "ops.yaml:6: op 'tadd': triton: grid[0]: cannot parse 'cdiv(n': '(' was never closed (in a YAML flow list or mapping, quote an expression that holds a comma)",
            "ops.yaml:6: op 'tadd': triton: grid[1]: cannot parse 'BLOCK)': unmatched ')' (in a YAML flow list or mapping, quote an expression that holds a comma)",
        ],
    ),
    (
        "configs_empty",
        spec(configs="    configs: []"),
        [
            "ops.yaml:7: op 'tadd': triton: 'configs' must be a non-empty list of mappings (constexprs, num_warps, num_stages)",
        ],
    ),
    (
        "config_not_mapping",
        spec(configs="    configs: [1024]"),
        [
            "ops.yaml:7: op 'tadd': triton: configs[0] must be a mapping, not 1024",
        ],
    ),
    (
        "num_warps",
        spec(configs="    configs: [{BLOCK: 1024, num_warps: 3}]"),
        [
            "ops.yaml:7: op 'tadd': triton: configs[0]: num_warps must be a power of two from 1 to 32, not 3",
        ],
    ),
    (
        "num_stages",
        spec(configs="    configs: [{BLOCK: 1024, num_stages: 0}]"),
        [
            "ops.yaml:7: op 'tadd': triton: configs[0]: num_stages must be a positive int, not 0",
        ],
    ),
    (
        "config_sets_param",
        spec(configs="    configs: [{BLOCK: 1024, n: 4}]"),
        [
            "ops.yaml:7: op 'tadd': triton: configs[0]: 'n' is a runtime parameter (a key of 'args'), not a constexpr",
        ],
    ),
    (
        "constexpr_value",
        spec(configs="    configs: [{BLOCK: 1024, EVEN: [1]}]"),
        [
            "ops.yaml:7: op 'tadd': triton: configs[0]: constexpr 'EVEN' must be an int, float, bool or string, not [1]",
        ],
    ),
    (
        "outputs_count",
        spec(outputs="    outputs: {out: empty_like(self), extra: empty_like(self)}"),
        [
            "ops.yaml:5: op 'tadd': triton: 'outputs' allocates 2 tensor(s), but the schema returns 1",
        ],
    ),
    (
        "outputs_missing",
        spec(outputs=None),
        [
            "ops.yaml:2: op 'tadd': triton: missing key 'outputs' (the op returns 1 tensor(s) for the binding to allocate)",
            "ops.yaml:4: op 'tadd': triton: args: 'out_ptr': unknown name 'out' (known: self, other, alpha)",
        ],
    ),
    (
        "outputs_on_inplace",
        spec(func=INPLACE, args=INPLACE_ARGS),
        [
            "ops.yaml:5: op 'tadd_': triton: the op returns written arguments, so it allocates nothing: remove 'outputs'",
        ],
    ),
    (
        "output_alloc",
        spec(outputs="    outputs: {out: zeros_like(self)}"),
        [
            "ops.yaml:5: op 'tadd': triton: output 'out': 'zeros_like(self)' is not empty_like(t) or empty_like(t, dtype=<dtype>)",
        ],
    ),
    (
        "output_like_not_tensor",
        spec(outputs="    outputs: {out: empty_like(alpha)}"),
        [
            "ops.yaml:5: op 'tadd': triton: output 'out': empty_like(alpha): 'alpha' is not a Tensor argument of the schema",
        ],
    ),
    (
        "output_dtype",
        spec(outputs="    outputs: {out: 'empty_like(self, dtype=float99)'}"),
        [
            "ops.yaml:5: op 'tadd': triton: output 'out': unknown dtype 'float99' (allowed: float32, float64, float16, bfloat16, int8, uint8, int16, int32, int64, bool)",
        ],
    ),
    (
        "output_named_return",
        spec(func=func("tadd(Tensor self, Tensor other, *, Scalar alpha=1) -> (Tensor result)")),
        [
            "ops.yaml:5: op 'tadd': triton: output 'out' must be named 'result', as the schema's return is",
        ],
    ),
    (
        "output_unused",
        spec(args=args("x_ptr: self, y_ptr: other, n: numel(self)")),
        [
            "ops.yaml:5: op 'tadd': triton: output 'out' is never passed to the kernel (no key of 'args' names it)",
        ],
    ),
    (
        "output_is_arg",
        spec(outputs="    outputs: {other: empty_like(self)}"),
        [
            "ops.yaml:5: op 'tadd': triton: output 'other' has the name of a schema argument",
            "ops.yaml:4: op 'tadd': triton: args: 'out_ptr': unknown name 'out' (known: self, other, alpha)",
        ],
    ),
    (
        "candidate_for",
        spec("    candidate_for: add.Tensor\n"),
        [
            "ops.yaml:8: op 'tadd': triton: candidate_for 'add.Tensor' is not an op overload like 'aten.add.Tensor' or 'mylib.scaled_add.default'",
        ],
    ),
    (
        "returns_view",
        spec(func=func("tadd(Tensor(a) self, Tensor other) -> Tensor(a)"), outputs=None),
        [
            "ops.yaml:2: op 'tadd': triton: a Triton op cannot return a view ('Tensor(a)')",
        ],
    ),
    (
        "returns_list",
        spec(func=func("tadd(Tensor self, Tensor other) -> Tensor[]")),
        [
            "ops.yaml:2: op 'tadd': triton: a Triton op cannot return a Tensor[]",
        ],
    ),
    (
        "returns_mixed",
        spec(func=func("tadd(Tensor(a!) self, Tensor other) -> (Tensor(a!), Tensor)")),
        [
            "ops.yaml:2: op 'tadd': triton: returns must all be written arguments or all be allocated by 'outputs'",
        ],
    ),
    (
        "contiguous_not_tensor",
        spec("    contiguous: [self, alpha]\n"),
        [
            "ops.yaml:8: op 'tadd': triton: 'contiguous' must list Tensor arguments of the schema; 'alpha' is not one",
        ],
    ),
    (
        "same_shape_one",
        spec("    same_shape: [self]\n"),
        [
            "ops.yaml:8: op 'tadd': triton: 'same_shape' must list Tensor arguments of the schema; list at least two",
        ],
    ),
]


@pytest.mark.parametrize(("text", "problems"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_triton_spec_reports_exact_problems(tmp_path: Path, text: str, problems: list[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path, display_name="ops.yaml")
    assert info.value.problems == problems


def test_cases_are_distinct() -> None:
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len({tuple(c[2]) for c in CASES}) == len(CASES)


def load(tmp_path: Path, text: str) -> tuple[OpSpec, ...]:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path, display_name="ops.yaml")


def test_valid_triton_op(tmp_path: Path) -> None:
    (op,) = load(tmp_path, spec("    candidate_for: aten.add.Tensor\n    same_shape: [self, other]\n"))
    assert op.backends == ("triton",) and op.kernels == () and op.python_name == "tadd"
    kernel = op.triton
    assert kernel is not None
    assert kernel.kernel == "pkg.kernels:add_kernel"
    assert kernel.params == ("x_ptr", "y_ptr", "out_ptr", "n", "alpha")
    assert [a.text for a in kernel.args] == ["self", "other", "out", "numel(self)", "alpha"]
    assert kernel.args[3].value == TensorProp("numel", "self")
    assert [(o.name, o.like, o.dtype) for o in kernel.outputs] == [("out", "self", None)]
    assert kernel.grid == ("cdiv(n, BLOCK)",)
    assert kernel.configs == (TritonConfig((("BLOCK", 1024),), 4, 3),)
    assert kernel.candidate_for == "aten.add.Tensor" and kernel.same_shape == ("self", "other")


def test_inplace_and_several_outputs(tmp_path: Path) -> None:
    two = (
        "- func: split2(Tensor self) -> (Tensor lo, Tensor hi)\n  triton:\n    kernel: pkg.k:split\n"
        "    args: {x: self, lo: lo, hi: hi, n: numel(self), s: 'stride(self, 0) * 2'}\n"
        "    outputs: {lo: empty_like(self), hi: 'empty_like(self, dtype=int64)'}\n"
        "    grid: [n, 1, 'max(n // 2, 1)']\n    configs: [{B: 1, num_warps: 32, num_stages: 1, EVEN: true}]\n"
    )
    inplace, pair = load(tmp_path, spec(func=INPLACE, args=INPLACE_ARGS, outputs=None) + two)
    assert inplace.variant is Variant.INPLACE and inplace.triton is not None and inplace.triton.outputs == ()
    assert pair.triton is not None and [o.text for o in pair.triton.outputs] == [
        "empty_like(self)",
        "empty_like(self, dtype=int64)",
    ]
    assert pair.triton.configs[0] == TritonConfig((("B", 1), ("EVEN", True)), 32, 1)


def test_every_problem_of_every_triton_op_at_once(tmp_path: Path) -> None:
    text = spec(kernel="    kernel: nope", grid="    grid: []") + spec(func=func(FUNC.replace("tadd", "tsub")))
    text += "  doc: [1]\n"
    with pytest.raises(SpecError) as info:
        load(tmp_path, text)
    assert [p.split(": op ")[0] for p in info.value.problems] == ["ops.yaml:6", "ops.yaml:3", "ops.yaml:15"]
