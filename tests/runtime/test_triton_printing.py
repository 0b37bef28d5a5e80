"""Deciding and printing apart: the passes that make Triton kernels leave a plan in each `FusedKernel`,
and `codegen.triton` prints it after the last pass. The fusion pass leaves a group the printer cannot
write to ATen, deciding it from the op rules of `ir.fusible` that the printer writes by: both must
agree, node for node and word for word."""

from __future__ import annotations

import pytest

from opgen.runtime.codegen.triton import ops
from opgen.runtime.codegen.triton.groups import CodegenError, kernel
from opgen.runtime.codegen.triton.kernels import print_kernels
from opgen.runtime.codegen.triton.module import Kernel
from opgen.runtime.ir import (
    FusedGroup,
    FusedKernel,
    Input,
    Program,
    Ref,
    Return,
    Step,
    Tensor,
    TensorMeta,
    Value,
    fusible,
)
from opgen.runtime.passes.fusion.calls import fused_call
from opgen.runtime.passes.fusion.expressible import unwritable


def meta(dtype: str, shape: tuple[int, ...] = (2, 3)) -> TensorMeta:
    return TensorMeta(shape, (shape[-1], 1) if len(shape) == 2 else (1,), dtype, "cuda:0")


def pointwise(target: str, values: tuple[tuple[str, object], ...], dtype: str = "float32") -> FusedGroup:
    x, y = Tensor("x", meta(dtype)), Tensor("y", meta(dtype))
    return FusedGroup("pointwise", (2, 3), (x,), (y,), (Step("y", target, (("self", Ref("x")), *values), (y,)),))


def row_amax(dtype: str) -> FusedGroup:
    x, y = Tensor("x", meta(dtype)), Tensor("y", meta(dtype, (2, 1)))
    values = (("self", Ref("x")), ("dim", (-1,)), ("keepdim", True))
    return FusedGroup("row", (2, 3), (x,), (y,), (Step("y", "aten.amax.default", values, (y,)),))


def cat_in_a_row_group() -> FusedGroup:
    a, b, y = Tensor("a", meta("float32")), Tensor("b", meta("float32")), Tensor("y", meta("float32", (2, 6)))
    cat = Step("y", "aten.cat.default", (("tensors", (Ref("a"), Ref("b"))), ("dim", -1)), (y,))
    return FusedGroup("row", (2, 6), (a, b), (y,), (cat,))


GROUPS = {
    "relu": pointwise("aten.relu.default", ()),
    "pow_2_7": pointwise("aten.pow.Tensor_Scalar", (("exponent", 2.7),)),
    "pow_2": pointwise("aten.pow.Tensor_Scalar", (("exponent", 2),)),
    "int_gelu": pointwise("aten.gelu.default", (("approximate", "none"),), "int32"),
    "amax_half": row_amax("float16"),
    "amax_int": row_amax("int64"),
    "cat_in_a_row_group": cat_in_a_row_group(),
}


def test_the_printer_has_an_expression_for_each_overload_the_rules_accept() -> None:
    assert list(ops.POINTWISE) == list(fusible.POINTWISE)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_the_pass_and_the_printer_agree_on_what_can_be_written(name: str) -> None:
    group = GROUPS[name]
    problem = unwritable(group)
    try:
        kernel(group)
    except CodegenError as exc:
        assert problem == str(exc)
    else:
        assert problem is None
    assert (problem is None) == (name in ("relu", "pow_2", "amax_half"))


def test_kernels_are_printed_after_the_passes_and_their_calls_named_after_them() -> None:
    group = GROUPS["relu"]
    spec = FusedKernel.make("fused0", group, inputs=(("x", "float32"),), outputs=(Value("y", meta("float32")),),
                            nodes=group.nodes, describe=group.describe())  # fmt: skip
    assert spec.name == spec.source == "" and spec.configs == ()  # decided, not printed
    body = (fused_call(spec), Return((Ref("y"),)))
    program = Program("forward", (Input("x", meta("float32")),), (), (), body, fused=(spec,))
    printed = print_kernels(program)
    (done,) = printed.fused
    assert done.plan is None and kernel(group) == Kernel(done.name, done.source, done.configs)
    assert printed.body[0].target == f"fused Triton kernel {done.name}"  # type: ignore[union-attr]
    assert print_kernels(printed) is printed  # once
