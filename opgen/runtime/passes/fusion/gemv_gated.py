"""Gated products: a gate/up pair of few-row products read only by `silu(gate) * up` (SwiGLU, the MLP
of Llama-family models) or `gelu(gate) * up` (GeGLU, Gemma's, exact or tanh-approximated) becomes one
matrix-vector kernel that computes both and writes the product.

The `gemv` pass finds the pair as siblings over one input; here it checks what reads them: each
output, through views that nothing else reads, reaches the activation (the gate) or the `mul` (the up
product), and the activation only that `mul`. The kernel then writes `silu(gate) * up` itself, so neither
product reaches memory and the pointwise kernel after them is gone. It rounds each intermediate to
the output's dtype where the separate calls store one, so it computes what they compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from opgen.runtime.ir import KernelCall, Line, Ref, Value
from opgen.runtime.passes.analysis import RESHAPES, writes_memory

SILU = "aten.silu.default"
GELU = "aten.gelu.default"
MUL = "aten.mul.Tensor"


@dataclass(frozen=True, slots=True)
class Gated:
    """Which product is the gate, and the lines after the pair that the kernel takes over."""

    gate: int  # index of the gate product in its siblings
    members: tuple[int, ...]  # body indices of the views, the silu and the mul
    lines: tuple[KernelCall, ...]  # those lines
    out: Value  # the mul's result: what the kernel writes
    at: int  # the mul's index: where the kernel's call goes
    activation: str = "silu"  # the gate's: "silu", "gelu" or "gelu_tanh" (`GemvPlan.activation`)


def gated(
    products: Sequence[KernelCall], at: Sequence[int], n: int, body: Sequence[Line], read_by: dict[str, set[int]]
) -> Gated | None:
    """The pair `products` (at body indices `at`, `n` elements each) as a gated product, or None;
    `read_by` is `analysis.readers(body)`."""
    if len(products) != 2:
        return None
    for gate in (0, 1):
        found = _match(products[gate], products[1 - gate], body, read_by)
        if found is None:
            continue
        members, mul, activation = found
        out = body[mul].outputs[0]  # type: ignore[union-attr]
        meta = out.meta if out is not None else None
        if meta is None or math.prod(meta.shape) != n or not meta.is_contiguous():
            return None  # the kernel writes its n elements one after another
        if any(writes_memory(body[i]) for i in range(min(at), mul)):
            return None  # the products would move after a write that may change their input
        lines = tuple(body[i] for i in (*members, mul))
        return Gated(gate, (*members, mul), lines, out, mul, activation)  # type: ignore[arg-type]
    return None


def _match(
    gate: KernelCall, up: KernelCall, body: Sequence[Line], read_by: dict[str, set[int]]
) -> tuple[list[int], int, str] | None:
    """(views, the mul's index, the activation) where `mul(act(views(gate)), views(up))` is all that reads
    the pair."""
    g_views, g_end, g_reader = _through_views(gate, body, read_by)
    u_views, u_end, mul = _through_views(up, body, read_by)
    if g_reader is None or mul is None:
        return None
    act = body[g_reader]
    activation = _activation(act, g_end)
    if activation is None:
        return None
    s = act.outputs[0].name  # type: ignore[union-attr]
    if read_by.get(s) != {mul} or not _call(body[mul], MUL, 2):
        return None
    if set(body[mul].args) != {Ref(s), Ref(u_end)}:  # type: ignore[union-attr]
        return None
    return sorted((*g_views, *u_views, g_reader)), mul, activation


def _activation(line: Line, gate: str) -> str | None:
    """ "silu", "gelu" or "gelu_tanh" where `line` is that activation of `gate`, else None."""
    if _call(line, SILU, 1) and line.args[0] == Ref(gate):  # type: ignore[union-attr]
        return "silu"
    if not isinstance(line, KernelCall) or line.target != GELU or line.args[:1] != (Ref(gate),):
        return None
    if len(line.outputs) != 1 or line.outputs[0] is None or writes_memory(line):
        return None
    approximate = dict(line.kwargs).get("approximate", line.args[1] if len(line.args) > 1 else "none")
    return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)  # type: ignore[arg-type]


def _through_views(
    line: KernelCall, body: Sequence[Line], read_by: dict[str, set[int]]
) -> tuple[list[int], str, int | None]:
    """(indices of the views that alone read the line's result, one after another; the last value;
    the index of its only reader, None where it has several)."""
    views: list[int] = []
    value = line.outputs[0].name  # type: ignore[union-attr]
    while True:
        found = read_by.get(value, set())
        if len(found) != 1:
            return views, value, None
        (reader,) = found
        line = body[reader]  # type: ignore[assignment]
        if not (isinstance(line, KernelCall) and line.target in RESHAPES and line.args[:1] == (Ref(value),)):
            return views, value, reader
        views.append(reader)
        value = line.outputs[0].name  # type: ignore[union-attr]


def _call(line: Line, target: str, arity: int) -> bool:
    return (
        isinstance(line, KernelCall)
        and line.target == target
        and len(line.args) == arity
        and not line.kwargs
        and len(line.outputs) == 1
        and line.outputs[0] is not None
        and not writes_memory(line)
    )
