"""Unit tests of the small typed pieces: schema parsing, defaults, C++ translation, registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from opgen.gen import bindings, registry, stub
from opgen.gen.cpp_types import cpp_arg, cpp_var
from opgen.spec.defaults import parse_default
from opgen.spec.model import Type, kernel_op_name
from opgen.spec.schema import SchemaSyntaxError, parse_schema
from opgen.spec.validate import load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_every_spec_schema_round_trips() -> None:
    for spec in load_spec(ROOT / "ops.yaml"):
        assert str(parse_schema(str(spec.schema))) == str(spec.schema)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Tensor", Type("Tensor")),
        ("Tensor?", Type("Tensor", optional=True)),
        ("Tensor[]", Type("Tensor", is_list=True)),
        ("Tensor?[]", Type("Tensor", is_list=True, elem_optional=True)),
        ("int[2]", Type("int", is_list=True, size=2)),
        ("int[1]?", Type("int", optional=True, is_list=True, size=1)),
        ("SymInt[]", Type("SymInt", is_list=True)),
    ],
)
def test_types_parse(text: str, expected: Type) -> None:
    schema = parse_schema(f"f({text} x) -> Tensor")
    assert schema.args[0].type == expected
    assert str(expected) == text


def test_alias_annotations_parse() -> None:
    schema = parse_schema("split(Tensor(a -> *) self, int n) -> Tensor(a)[]")
    assert schema.args[0].alias is not None and schema.args[0].alias.wildcard
    assert schema.returns[0].type.is_list and schema.returns[0].alias is not None
    out = parse_schema("f(Tensor self, *, Tensor(a!) out) -> Tensor(a!)")
    assert out.args[1].kwarg_only and out.args[1].alias is not None and out.args[1].alias.is_write


def test_schema_syntax_error_names_the_argument() -> None:
    with pytest.raises(SchemaSyntaxError, match="arg 'x': unknown type 'Foo'"):
        parse_schema("f(Tensor self, Foo x) -> Tensor")


@pytest.mark.parametrize(
    ("type_text", "default", "value"),
    [
        ("int", "-1", -1),
        ("int[2]", "1", [1, 1]),
        ("int[]", "[0, 2]", [0, 2]),
        ("float", "1e-05", 1e-05),
        ("float", "-inf", float("-inf")),
        ("bool", "False", False),
        ("Scalar", "1", 1),
        ("Scalar", "0.5", 0.5),
        ("str", '"none"', "none"),
        ("int?", "None", None),
        ("MemoryFormat", "contiguous_format", "contiguous_format"),
        ("ScalarType?", "long", "Long"),
        ("ScalarType", "Float", "Float"),
    ],
)
def test_defaults_parse(type_text: str, default: str, value: object) -> None:
    type_ = parse_schema(f"f({type_text} x) -> Tensor").args[0].type
    assert parse_default(type_, default) == value


def test_cpp_translation() -> None:
    schema = parse_schema(
        "f(Tensor self, Tensor? w, int[2] stride=1, int[1]? dim=None, str? r=None, Scalar alpha=1, "
        "float eps=-inf, *, Tensor(a!) out) -> Tensor(a!)"
    )
    args = [cpp_arg(a, i) for i, a in enumerate(schema.args)]
    assert args[0].decl == "const at::Tensor&" and args[0].convert == "opgen::tensor(slots[0], sig, 0)"
    assert args[1].convert == "opgen::convert_optional<at::Tensor>(slots[1], sig, 1)"
    assert args[2].convert == "opgen::int_list(slots[2], sig, 2, 2)"
    assert args[2].default == "std::vector<int64_t>({1, 1})"
    assert args[3].pass_expr == "opgen::opt_ref(dim)" and args[3].default == "std::nullopt"
    assert args[4].pass_expr == "opgen::opt_view(r)"
    assert args[5].default == "at::Scalar(int64_t(1))"
    assert args[6].default == "double(-std::numeric_limits<double>::infinity())"
    assert args[7].decl == "at::Tensor&" and args[7].convert.startswith("opgen::mutable_tensor(")
    assert cpp_var("default") == "default_" and cpp_var("self") == "self"


def test_cpp_translation_of_bool_array() -> None:
    """`bool[3]` (the output masks of backward ops) converts into ATen's std::array<bool, 3>."""
    (arg,) = parse_schema("f(bool[3] output_mask) -> Tensor").args
    translated = cpp_arg(arg, 0)
    assert translated.decl == "const std::array<bool, 3>"
    assert translated.convert == "opgen::bool_array<3>(slots[0], sig, 0)"
    assert translated.default is None and translated.pass_expr == "output_mask"


def test_kernel_op_name() -> None:
    assert [kernel_op_name(f) for f in ("add_outf", "add_", "_softmax", "relu", "__and__")] == [
        "add",
        "add",
        "_softmax",
        "relu",
        "__and__",
    ]


def _ops(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "ops.yaml"
    path.write_text(text)
    return load_spec(path)


def test_variants_and_registry(tmp_path: Path) -> None:
    ops = _ops(
        tmp_path,
        "- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor\n"
        "  kernels: {cpu: at::cpu::add, cuda: at::cuda::add}\n"
        "  inplace: add_.Tensor\n"
        "  out: add.out\n"
        "  doc: Adds.\n",
    )
    assert [o.python_name for o in ops] == ["add", "add_", "add_out"]
    assert [k.qualified_name for k in ops[2].kernels] == ["at::cpu::add_outf", "at::cuda::add_outf"]
    infos = registry.registry(ops)
    assert infos[0]["inplace"] == "add_" and infos[0]["out"] == "add_out" and infos[2]["functional"] == "add"
    assert infos[0]["args"][2] == {
        "name": "alpha",
        "type": "Scalar",
        "kind": "attr",
        "kwarg_only": True,
        "optional": True,
        "default": 1,
    }
    assert infos[1]["mutates"] == ["self"] and infos[1]["is_inplace"]
    assert infos[2]["args"][3]["out"] and infos[2]["returns"][0]["aliases_arg"] == "out"
    assert infos[0]["backends"] == ["cpu", "cuda"]


def test_emitted_function_shape(tmp_path: Path) -> None:
    ops = _ops(
        tmp_path,
        "- func: relu(Tensor self) -> Tensor\n"
        "  kernels: {cpu: at::cpu::relu, cuda: at::cuda::relu}\n"
        "  inplace: relu_\n"
        "  out: {func: relu.out, kernels: {default: at::compositeexplicitautograd::relu_outf}}\n",
    )
    functional, inplace, out = (bindings.emit_function(o) for o in ops)
    assert functional.startswith("// ops.yaml:1: relu(Tensor self) -> Tensor\n")
    assert "case c10::DeviceType::CPU:\n      return opgen::wrap(at::cpu::relu(self));" in functional
    assert "#ifdef OPGEN_WITH_CUDA\n    case c10::DeviceType::CUDA:" in functional
    assert "at::cpu::relu_(self);\n      return opgen::same(slots[0]);" in inplace
    assert "    default:\n      at::compositeexplicitautograd::relu_outf(self, out);" in out
    assert bindings.text_signature(ops[2]) == "relu_out($module, self, *, out)"
    assert stub.stub_function(ops[0]).startswith("def relu(self: Tensor) -> Tensor:")


def test_release_gil_wraps_the_kernel_call(tmp_path: Path) -> None:
    ops = _ops(tmp_path, "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n  release_gil: true\n")
    assert "opgen::without_gil([&] { return at::cpu::relu(self); })" in bindings.emit_function(ops[0])


def test_checks_run_before_the_kernel(tmp_path: Path) -> None:
    ops = _ops(
        tmp_path,
        "- func: _native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean,"
        " Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)\n"
        "  kernels: {default: at::compositeexplicitautograd::_native_batch_norm_legit_no_training}\n"
        "  checks: [batch_norm_channels]\n",
    )
    assert ops[0].checks == ("batch_norm_channels",)
    text = bindings.emit_function(ops[0])
    check = "opgen::checks::batch_norm_channels(sig, input, weight, bias, running_mean, running_var);"
    assert check in text
    assert text.index("devices.add(") < text.index(check) < text.index("at::compositeexplicitautograd::")
