"""The registry of kernel_ops with extensions beside it (`opgen.runtime.extension_registry`), from fake
extension modules whose registries are kernel_ops' own entries renamed: no build needed."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from opgen import kernel_ops
from opgen.runtime.errors import OpgenError
from opgen.runtime.extension_registry import Kernels, kernels, merged, prefix
from opgen.runtime.pipeline import default_registry
from opgen.runtime.registry import overload_name


def entry(source: str, **changes: Any) -> dict[str, Any]:
    """kernel_ops' args-info entry of `source`, with `changes`."""
    info = copy.deepcopy(kernel_ops.get_kernel_op_info(source))
    info.update(changes)
    return info


def extension(name: str, entries: list[dict[str, Any]], build: str = "b1") -> SimpleNamespace:
    """A module as opgen_add_extension builds it, as far as the registry reads it."""
    functions = {e["name"]: (lambda *a, _n=e["name"]: (_n, a)) for e in entries}
    ops = SimpleNamespace(
        BUILD_ID=build,
        get_kernel_ops_args_info=lambda: {e["name"]: e for e in entries},
        get_kernel_op_names=lambda: [e["name"] for e in entries],
        **functions,
    )
    return SimpleNamespace(__name__=name, kernel_ops=ops)


def scaled_add(module: str = "my_ops") -> SimpleNamespace:
    ops = [
        entry("add", name="scaled_add", aten="mylib::scaled_add", inplace="scaled_add_", out=None,
              functional="scaled_add", torch_op="mylib.scaled_add.default"),
        entry("add_", name="scaled_add_", aten="mylib::scaled_add_", functional="scaled_add", out=None),
        entry("triton_add", name="scaled_add_triton", functional="scaled_add_triton",
              triton={"candidate_for": "mylib.scaled_add.default", "contiguous": ["self"], "same_shape": []}),
    ]  # fmt: skip
    return extension(module, ops)


def test_an_extensions_ops_join_under_its_prefix_and_their_torch_op() -> None:
    base = default_registry()
    registry = merged(base, [scaled_add()])
    info = registry.lookup("mylib::scaled_add.default")
    assert info is not None and info.name == "my_ops__scaled_add" and info.module == "my_ops"
    assert registry.sibling(info, "inplace") is registry.by_name["my_ops__scaled_add_"]  # siblings renamed too
    assert registry.by_name["add"] is base.by_name["add"] and base.lookup("mylib::scaled_add") is None
    assert registry.build_id == f"{base.build_id}+my_ops:b1"
    assert prefix(SimpleNamespace(__name__="pkg.my_ops")) == "pkg_my_ops__"


def test_a_triton_op_of_an_extension_is_a_candidate_for_its_custom_op() -> None:
    assert overload_name("mylib.scaled_add.default") == "mylib::scaled_add"
    assert overload_name("aten.add.Tensor") == "aten::add.Tensor"
    registry = merged(default_registry(), [scaled_add()])
    assert [c.name for c in registry.candidates("mylib::scaled_add")] == ["my_ops__scaled_add_triton"]


def test_kernel_ops_keeps_an_op_an_extension_also_binds() -> None:
    times = entry("mul", name="times", functional="times", inplace=None, out=None)  # binds aten::mul.Tensor too
    registry = merged(default_registry(), [extension("my_ops", [times])])
    assert registry.lookup("aten::mul.Tensor").name == "mul"  # type: ignore[union-attr]
    assert "my_ops__times" in registry.by_name


def test_two_extensions_binding_one_custom_op_is_an_error_naming_both() -> None:
    with pytest.raises(OpgenError, match=r"mylib::scaled_add is bound by two extensions, 'my_ops' .* 'other_ops'"):
        merged(default_registry(), [scaled_add("my_ops"), scaled_add("other_ops")])


def test_generated_code_finds_extension_kernels_beside_kernel_ops() -> None:
    assert kernels(kernel_ops, []) is kernel_ops
    namespace = kernels(kernel_ops, [scaled_add()])
    assert isinstance(namespace, Kernels)
    assert namespace.my_ops__scaled_add(1) == ("scaled_add", (1,)) and namespace.add is kernel_ops.add
    with pytest.raises(AttributeError):
        _ = namespace.my_ops__missing


def test_register_refuses_what_is_no_extension_and_a_second_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from opgen import extensions

    monkeypatch.setattr(extensions, "_modules", {})  # this process's real registrations stay as they are
    with pytest.raises(extensions.ExtensionError, match=r"is not a module"):
        extensions.register(object())  # type: ignore[arg-type]
    with pytest.raises(extensions.ExtensionError, match=r"'plain' is not an opgen extension \(it lacks THUNKS"):
        extensions.register(SimpleNamespace(__name__="plain", kernel_ops=kernel_ops))  # type: ignore[arg-type]

    def build(build_id: str) -> SimpleNamespace:
        ops = SimpleNamespace(BUILD_ID=build_id, get_kernel_ops_args_info=dict)
        return SimpleNamespace(__name__="my_ops", kernel_ops=ops, THUNKS=None, THUNK_DIGEST="d", register_thunks=None)

    first = build("b1")
    extensions.register(first)  # type: ignore[arg-type]
    extensions.register(first)  # type: ignore[arg-type] # importing it again changes nothing
    extensions.register(build("b1"))  # type: ignore[arg-type] # the same build loaded again
    assert extensions.registered() == (first,) and extensions.find("my_ops") is first
    with pytest.raises(extensions.ExtensionError, match=r"a second build of extension 'my_ops' \(build b2\)"):
        extensions.register(build("b2"))  # type: ignore[arg-type]
