"""The generator's output for Triton ops: the C++ body, the registry's `triton` section, the expression printer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from opgen.gen import bindings, registry, triton_bindings
from opgen.gen.emit import emit
from opgen.jit import expr as jx
from opgen.spec.model import Arg, OpSpec, Type
from opgen.spec.validate import load_spec

ROOT = Path(__file__).resolve().parents[2]
TRITON_ADD = {
    "kernel": "opgen.jit.library:add_kernel",
    "params": ["x_ptr", "y_ptr", "out_ptr", "n_elements", "alpha"],
    "args": {"x_ptr": "self", "y_ptr": "other", "out_ptr": "out", "n_elements": "numel(self)", "alpha": "alpha"},
    "outputs": {"out": "empty_like(self)"},
    "grid": ["cdiv(n_elements, BLOCK)"],
    "configs": [
        {"meta": {"BLOCK": 1024}, "num_warps": 4, "num_stages": 3},
        {"meta": {"BLOCK": 4096}, "num_warps": 8, "num_stages": 3},
    ],
    "candidate_for": "aten.add.Tensor",
    "contiguous": ["self", "other"],
    "same_shape": ["self", "other"],
}
SPEC = """\
- func: tmix(Tensor self, Tensor? w, int k, float f, bool b, Scalar s, int? ok=None) -> (Tensor lo, Tensor hi)
  triton:
    kernel: pkg.k:mix
    args:
      x: self
      w: w
      lo: lo
      hi: hi
      k: k
      f: f
      b: b
      s: s
      ok: ok
      n: max(numel(self) // -k, size(self, 1)) - stride(self, 0)
      c: 7
    outputs: {lo: empty_like(self), hi: 'empty_like(self, dtype=bfloat16)'}
    grid: ['cdiv(n, B)']
    configs: [{B: 64}]
- func: tscale_(Tensor(a!) self, float f) -> Tensor(a!)
  triton:
    kernel: pkg.k:scale
    args: {x: self, n: numel(self), f: f}
    grid: ['cdiv(n, B)']
    configs: [{B: 64}]
"""


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[OpSpec, ...]:
    path = tmp_path_factory.mktemp("spec") / "ops.yaml"
    path.write_text(SPEC)
    return load_spec(path)


def test_registry_entry_of_triton_add() -> None:
    (spec,) = [s for s in load_spec(ROOT / "ops.yaml") if s.python_name == "triton_add"]
    info = json.loads(registry.entry_json(spec))
    assert info["triton"] == TRITON_ADD
    assert info["backends"] == ["triton"] and info["kernels"] == {} and info["aten"] == "opgen::triton_add"
    assert info["variant"] == "functional" and info["release_gil"] is False


def test_binding_embeds_the_registry_entry() -> None:
    """The SpecKernel's JSON is, byte for byte, the registry entry module.cpp holds."""
    files = emit(load_spec(ROOT / "ops.yaml"), "ops.yaml")
    (shard,) = [t for n, t in files.items() if "kernel_ops_triton_add(" in t]
    embedded = re.search(r'kSpec_triton_add\{"triton_add", (".*")\};', shard)
    assert embedded is not None
    in_registry = re.search(r'\{"triton_add", R"opgen\((.*)\)opgen"\}', files["module.cpp"])
    assert in_registry is not None
    assert json.loads(json.loads(embedded.group(1))) == json.loads(in_registry.group(1))
    assert "#include <opgen/jit/jit_binding.h>" in shard
    assert sum("opgen/jit/jit_binding.h" in t for t in files.values()) == 1  # only the shard with a Triton op


def test_functional_binding(ops: tuple[OpSpec, ...]) -> None:
    lines = triton_bindings.launch_lines(ops[0])
    assert lines[:2] == ["opgen::jit::require_cuda(sig, self, 0);", "opgen::jit::require_cuda(sig, w, 1);"]
    assert "at::Tensor lo = opgen::jit::empty_like(self);" in lines
    assert "at::Tensor hi = opgen::jit::empty_like(self, at::ScalarType::BFloat16);" in lines
    assert lines[-1] == "return opgen::wrap(std::make_tuple(std::move(lo), std::move(hi)));"
    launch = lines[-2]
    assert launch.startswith("opgen::jit::launch(kSpec_tmix, {opgen::jit::tensor_arg(self), ")
    expected = [
        "opgen::jit::tensor_arg(w)",
        "opgen::jit::tensor_arg(lo)",
        "opgen::jit::int_arg(k)",
        "opgen::jit::float_arg(f)",
        "opgen::jit::bool_arg(b)",
        "opgen::jit::scalar_arg(s)",
        "opgen::jit::int_arg(ok)",
        "opgen::jit::int_arg(int64_t(7))",
    ]
    assert all(e in launch for e in expected), launch


def test_inplace_binding_returns_its_argument(ops: tuple[OpSpec, ...]) -> None:
    lines = triton_bindings.launch_lines(ops[1])
    assert lines[-2] == (
        "opgen::jit::launch(kSpec_tscale_, {opgen::jit::tensor_arg(self), "
        "opgen::jit::int_arg(self.numel()), opgen::jit::float_arg(f)});"
    )
    assert lines[-1] == "return opgen::same(slots[0]);"
    assert not any("empty_like" in line for line in lines)
    function = bindings.emit_function(ops[1])
    assert "at::Tensor& self = opgen::mutable_tensor(slots[0], sig, 0);" in function
    assert "switch (devices.type())" not in function and "without_gil" not in function


def test_expression_printer() -> None:
    text = "max(numel(self) // -k, size(self, 1)) - stride(self, 0)"
    assert jx.to_cpp(jx.parse(text), lambda name: name + "_") == (
        "(std::max<int64_t>(opgen::jit::floordiv(self_.numel(), (-int64_t(k_))), self_.size(1)) - self_.stride(0))"
    )
    assert jx.to_cpp(jx.parse("cdiv(n, 4)"), str) == (
        "opgen::jit::floordiv(((int64_t(n) + int64_t(4)) - int64_t(1)), int64_t(4))"
    )
    assert jx.to_cpp(jx.parse("min(2 * n, 3)"), str) == "std::min<int64_t>((int64_t(2) * int64_t(n)), int64_t(3))"


def test_kernel_arg_refuses_unpassable_types() -> None:
    arg = jx.Name("dims")
    with pytest.raises(ValueError, match="cannot pass a 'int\\[\\]'"):
        triton_bindings.kernel_arg(
            triton_bindings.TritonArg("d", "dims", arg), {"dims": Arg("dims", Type("int", is_list=True))}
        )
