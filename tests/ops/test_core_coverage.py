"""kernel_ops binds every overload of torch's Core ATen opset, or this file says why not.

The core opset is read from the installed torch at test time (`torch.Tag.core` on the overloads of
`torch.ops.aten`), so a torch that adds core ops fails here until each is bound or excluded with
a reason. Exclusions are reviewed: each names what opgen lacks.
"""

from __future__ import annotations

import pytest
import torch

from opgen import kernel_ops

INFO = kernel_ops.get_kernel_ops_args_info()
BOUND = {info["aten"].removeprefix("aten::") for info in INFO.values()}

_NOT_A_TENSOR = "returns a {what}, not a tensor: kernel_ops binds tensor-returning kernels, and the runtime folds {why}"
_BACKWARD = (
    "a backward kernel: opgen runs inference graphs, and ATen's backward kernels trust their caller "
    "(eager torch 2.13 itself segfaults on _adaptive_avg_pool2d_backward with an empty spatial dim), "
    "so binding them directly would let a Python call crash the process"
)
EXCLUDED: dict[str, str] = {
    **dict.fromkeys(
        (
            "_adaptive_avg_pool2d_backward",
            "avg_pool2d_backward",
            "convolution_backward",
            "embedding_dense_backward",
            "max_pool2d_with_indices_backward",
            "native_group_norm_backward",
            "native_layer_norm_backward",
        ),
        _BACKWARD,
    ),
    "sym_numel": _NOT_A_TENSOR.format(what="SymInt", why="shapes into constants at compile time"),
    "sym_size.int": _NOT_A_TENSOR.format(what="SymInt", why="shapes into constants at compile time"),
    "sym_stride.int": _NOT_A_TENSOR.format(what="SymInt", why="strides into constants at compile time"),
    "sym_is_contiguous": _NOT_A_TENSOR.format(what="SymBool", why="layout facts into constants at compile time"),
    "sym_storage_offset": _NOT_A_TENSOR.format(what="SymInt", why="offsets into constants at compile time"),
    "_local_scalar_dense": _NOT_A_TENSOR.format(
        what="Scalar (Tensor.item())", why="no such reads (export refuses data-dependent Python numbers)"
    ),
    "_native_batch_norm_legit.no_stats": (
        "ATen's kernel reads the running statistics it was not given when training=False and crashes the "
        "process (eager torch too, torch 2.13); kernel_ops must never crash, and inference graphs use "
        "_native_batch_norm_legit_no_training instead"
    ),
}


def core_overloads() -> list[str]:
    """`name` or `name.overload` of each aten overload tagged core, as kernel_ops' registry spells them.

    All of ATen's registered operators, not `dir(torch.ops.aten)`: that lists only packets loaded so far.
    """
    found = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        name, _, overload = rest.partition(".")
        if namespace != "aten":
            continue
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        if torch.Tag.core in op.tags:
            found.add(name if not overload or overload == "default" else f"{name}.{overload}")
    return sorted(found)


CORE = core_overloads()


def test_core_opset_is_found() -> None:
    assert len(CORE) > 150, f"only {len(CORE)} core overloads: did torch change how it tags them?"


def test_every_core_overload_is_bound_or_excluded() -> None:
    unbound = [op for op in CORE if op not in BOUND and op not in EXCLUDED]
    assert not unbound, (
        f"{len(unbound)} core ATen overloads have no kernel_ops binding and no reason in EXCLUDED: "
        + ", ".join(unbound)
    )


@pytest.mark.parametrize("op", sorted(EXCLUDED))
def test_exclusions_are_current(op: str) -> None:
    """An exclusion names a core op that is still unbound: stale entries go."""
    assert op in CORE, f"{op} is no longer a core overload; remove it from EXCLUDED"
    assert op not in BOUND, f"{op} is bound now; remove it from EXCLUDED"


# Core ops whose out variant kernel_ops does not bind, each with the reason. Empty today: every
# out variant ATen has for a bound core op is bound (and tested against eager by tests/ops).
OUT_NOT_YET: dict[str, str] = {}


def test_core_groups_bind_their_variants() -> None:
    """Where ATen has an out variant of a bound core functional op, kernel_ops binds it too."""
    missing = []
    for op in CORE:
        if op not in BOUND:
            continue
        name = next(n for n, info in INFO.items() if info["aten"] == f"aten::{op}")
        packet = getattr(torch.ops.aten, op.partition(".")[0])
        if INFO[name]["out"] is None and _has_matching_out(packet, op) and op not in OUT_NOT_YET:
            missing.append(op)
    assert not missing, f"core ops whose out variant ATen has but kernel_ops does not bind: {missing}"


def _has_matching_out(packet: torch._ops.OpOverloadPacket, op: str) -> bool:
    overload = op.partition(".")[2] or "default"
    functional = getattr(packet, overload)._schema
    names = [a.name for a in functional.arguments]
    for other in packet.overloads():
        schema = getattr(packet, other)._schema
        outs = [a for a in schema.arguments if a.is_out]
        if outs and [a.name for a in schema.arguments if not a.is_out] == names:
            return True
    return False


def _aten_schema(aten: str) -> torch.FunctionSchema:
    name, _, overload = aten.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")._schema


def _inputs(schema: torch.FunctionSchema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]


@pytest.mark.parametrize("name", sorted(n for n, info in INFO.items() if info["variant"] == "out"))
def test_out_variant_takes_its_functional_arguments(name: str) -> None:
    """A bound out variant is the overload matching its functional (`add.Scalar_out` for `add.Scalar`,
    not `add.out`): the same arguments, names and types, plus the outs."""
    functional = INFO[name]["functional"]
    if functional is None or INFO[functional]["backends"] == ["triton"]:
        pytest.skip("no ATen functional op in its group")
    assert _inputs(_aten_schema(INFO[name]["aten"])) == _inputs(_aten_schema(INFO[functional]["aten"]))
