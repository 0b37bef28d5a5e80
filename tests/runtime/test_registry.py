"""The registry index and argument binding: schema names, defaults, keywords only where forced."""

from __future__ import annotations

import pytest

from opgen.runtime.ir import Ref, Sym
from opgen.runtime.registry import REQUIRED, BindError, bind, call_args, scalar_overload


def test_lookup_by_overload(registry) -> None:
    assert registry.lookup("aten::add.Tensor").name == "add"
    assert registry.lookup("aten::relu.default").name == "relu"  # `.default` is the empty overload
    assert registry.lookup("aten::kthvalue.default") is None
    add = registry.lookup("aten::add.Tensor")
    assert registry.sibling(add, "out").name == "add_out" and registry.sibling(add, "inplace").name == "add_"


def test_bind_fills_defaults_and_call_args_leaves_them_out(registry) -> None:
    add = registry.lookup("aten::add.Tensor")
    values = bind(add, [Ref("a"), Ref("b")], {})
    assert values == {"self": Ref("a"), "other": Ref("b"), "alpha": 1}
    assert call_args(add, values) == ((Ref("a"), Ref("b")), ())
    assert call_args(add, bind(add, [Ref("a"), Ref("b")], {"alpha": 2})) == ((Ref("a"), Ref("b")), (("alpha", 2),))
    assert call_args(add, bind(add, [Ref("a"), Ref("b")], {"alpha": 1.0})) == ((Ref("a"), Ref("b")), (("alpha", 1.0),))


def test_positional_defaults_kept_when_a_later_one_is_given(registry) -> None:
    pool = registry.lookup("aten::max_pool2d_with_indices")
    values = bind(pool, [Ref("x"), (3, 3), (), (0, 0), (1, 1), True], {})
    assert call_args(pool, values)[0] == (Ref("x"), (3, 3), (), (0, 0), (1, 1), True)
    assert call_args(pool, bind(pool, [Ref("x"), (3, 3), (2, 2), (0, 0), (1, 1), False], {}))[0] == (
        Ref("x"),
        (3, 3),
        (2, 2),
    )


def test_symbol_defaults(registry) -> None:
    clone = registry.lookup("aten::clone")
    contiguous = registry.lookup("aten::contiguous")
    assert contiguous.arg("memory_format").default == Sym("memory_format", "contiguous_format")
    assert clone.arg("self").default is REQUIRED
    values = bind(clone, [Ref("x")], {"memory_format": Sym("memory_format", "channels_last")})
    assert call_args(clone, values) == ((Ref("x"),), (("memory_format", Sym("memory_format", "channels_last")),))


def test_bind_errors_name_the_overload(registry) -> None:
    add = registry.lookup("aten::add.Tensor")
    with pytest.raises(BindError, match=r"aten::add\.Tensor takes 2 positional arguments, the graph passes 3"):
        bind(add, [Ref("a"), Ref("b"), 1], {})
    with pytest.raises(BindError, match="unexpected or repeated argument 'beta'"):
        bind(add, [Ref("a"), Ref("b")], {"beta": 1})
    with pytest.raises(BindError, match="no value for required argument 'other'"):
        bind(add, [Ref("a")], {})


def test_scalar_overload_for_numbers_in_tensor_arguments(registry) -> None:
    mul = registry.lookup("aten::mul.Tensor")
    assert scalar_overload(registry, mul, {"other"}).name == "mul_scalar"
    pow_ = registry.lookup("aten::pow.Tensor_Tensor")
    assert scalar_overload(registry, pow_, {"exponent"}).name == "pow_scalar"
    assert scalar_overload(registry, registry.lookup("aten::where.self"), {"other"}) is None


def test_view_sources_come_from_alias_annotations(registry) -> None:
    assert registry.lookup("aten::view").view_source == "self"
    assert registry.lookup("aten::split_with_sizes").view_source == "self"
    assert registry.lookup("aten::add.Tensor").view_source is None
