"""ops.yaml against the installed torch: each schema is torch's own, each kernel is declared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from opgen.spec.defaults import MEMORY_FORMATS, parse_default
from opgen.spec.kernels import own_header
from opgen.spec.model import OpSpec, Schema
from opgen.spec.schema import parse_schema
from opgen.spec.validate import load_spec

SCALAR_TYPE_VALUES = {4: "Long", 6: "Float", 7: "Double", 11: "Bool"}  # the ones ops.yaml's defaults use
ROOT = Path(__file__).resolve().parents[2]
OPS = load_spec(ROOT / "ops.yaml")
TORCH_INCLUDE = Path(os.path.dirname(torch.__file__)) / "include"


def normalized(schema: Schema) -> tuple[object, ...]:
    """The schema with defaults as values, so `[1, 1]` equals `1` for an int[2]."""

    def default(arg):  # type: ignore[no-untyped-def]
        if arg.default is None:
            return None
        if arg.type.base == "MemoryFormat" and arg.default.isdigit():  # torch prints the enum value
            return MEMORY_FORMATS[int(arg.default)]
        if arg.type.base == "ScalarType" and arg.default.isdigit():  # c10::ScalarType's value
            return SCALAR_TYPE_VALUES[int(arg.default)]
        return parse_default(arg.type, arg.default)

    args = tuple((a.name, a.type, a.kwarg_only, a.alias, default(a)) for a in schema.args)
    return schema.name, schema.overload, args, schema.returns


ATEN_OPS = [s for s in OPS if s.triton is None and not any(k.own for k in s.kernels)]
OWN_OPS = [s for s in OPS if any(k.own for k in s.kernels)]
# opgen's own kernels -> the torch.ops overload they stand for (their post-op scalars are float[],
# where torch's are Scalar?[])
OWN_COUNTERPARTS = {
    "mkldnn_linear_pointwise": "mkldnn._linear_pointwise.default",
    "mkldnn_linear_pointwise_binary": "mkldnn._linear_pointwise.binary",
    "mkldnn_convolution_pointwise": "mkldnn._convolution_pointwise.default",
    "mkldnn_convolution_pointwise_binary": "mkldnn._convolution_pointwise.binary",
    "mkl_linear": "mkl._mkl_linear.default",
}
CANDIDATES = [s for s in OPS if s.triton is not None and s.triton.candidate_for]


def torch_schema(qualified: str) -> Schema:
    """`aten.add.Tensor` (or `add.Tensor`, `relu`) -> torch's own schema of that overload."""
    name, _, overload = qualified.removeprefix("aten.").partition(".")
    packet = getattr(torch.ops.aten, name)
    return parse_schema(str(getattr(packet, overload or "default")._schema).removeprefix("aten::"))


@pytest.mark.parametrize("spec", ATEN_OPS, ids=[s.python_name for s in ATEN_OPS])
def test_schema_matches_torch(spec: OpSpec) -> None:
    theirs = torch_schema(spec.schema.qualified_name)
    assert normalized(spec.schema) == normalized(theirs), f"\nours:   {spec.schema}\ntorch:  {theirs}"


@pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_convolution_pointwise"), reason="torch without oneDNN")
@pytest.mark.parametrize("spec", OWN_OPS, ids=[s.python_name for s in OWN_OPS])
def test_own_kernel_takes_its_torch_counterparts_arguments(spec: OpSpec) -> None:
    namespace, name, overload = OWN_COUNTERPARTS[spec.python_name].split(".")
    theirs = getattr(getattr(getattr(torch.ops, namespace), name), overload)._schema
    ours = [(a.name, str(a.type).replace("float[]", "Scalar?[]")) for a in spec.schema.args]
    assert ours == [(a.name, str(a.type).replace("List[Optional[number]]", "Scalar?[]")
                     .replace("Optional[number]", "Scalar?").replace("Optional[str]", "str?")
                     .replace("Optional[Tensor]", "Tensor?").replace("List[int]", "int[]"))
                    for a in theirs.arguments]  # fmt: skip


@pytest.mark.parametrize("spec", CANDIDATES, ids=[s.python_name for s in CANDIDATES])
def test_triton_candidate_takes_the_overloads_arguments(spec: OpSpec) -> None:
    """A Triton op offered as a candidate for an ATen overload is called with that overload's arguments."""
    assert spec.triton is not None and spec.triton.candidate_for
    theirs = torch_schema(spec.triton.candidate_for)
    assert normalized(spec.schema)[2:] == normalized(theirs)[2:], f"\nours:   {spec.schema}\ntorch:  {theirs}"


@pytest.mark.parametrize("spec", OPS, ids=[s.python_name for s in OPS])
def test_kernels_are_declared(spec: OpSpec) -> None:
    for kernel in spec.kernels:
        header = own_header() if kernel.own else TORCH_INCLUDE / kernel.header
        assert header.exists(), f"{kernel.qualified_name}: no header {kernel.header}"
        assert f" {kernel.function}(" in header.read_text(), f"{header.name} does not declare {kernel.function}"


def test_coverage_includes_resnet_and_gpt_ops() -> None:
    """Every op ResNet-18 (eval) and a GPT block need after run_decompositions() is bound."""
    needed = {
        "convolution.default",
        "_native_batch_norm_legit_no_training.default",
        "relu.default",
        "max_pool2d_with_indices.default",
        "add.Tensor",
        "mean.dim",
        "view.default",
        "permute.default",
        "addmm.default",
        "native_layer_norm.default",
        "bmm.default",
        "expand.default",
        "clone.default",
        "split_with_sizes.default",
        "mul.Tensor",
        "alias.default",
        "bitwise_not.default",
        "scalar_tensor.default",
        "where.self",
        "_softmax.default",
        "gelu.default",
        "_unsafe_view.default",
    }
    bound = {s.schema.qualified_name if s.schema.overload else f"{s.schema.name}.default" for s in ATEN_OPS}
    assert needed <= bound, sorted(needed - bound)
    assert len(OPS) >= 100
