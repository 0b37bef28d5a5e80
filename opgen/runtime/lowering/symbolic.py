"""Symbolic sizes from an FX graph (dynamic shapes): SymInts as IR `SizeExpr`s, their bindings and ranges.

A graph traced with dynamic shapes carries SymInts: in fake tensors' sizes and strides, in
`sym_size` nodes and the integer arithmetic on them. Each becomes an IR size, the canonical text
of its shape-environment expression over the graph's size symbols (`s27*s77`), so no node is left
for the shape arithmetic itself: the expressions are printed where they are used and bound once
per call (`passes.sizes`). Every symbol must be readable from an input, as one dimension of a
tensor input (`s27 = x.shape[1]`) or as a SymInt input of its own (torch.compile); data-dependent
(unbacked) sizes are a `DynamicShapeError`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from opgen.runtime.errors import OpgenError
from opgen.runtime.ir import Input, Size, SizeExpr, SizeLet, size_symbols
from opgen.runtime.ir.sizes import SizeRange, from_expr


class DynamicShapeError(OpgenError):
    """The graph has sizes opgen cannot compute from its inputs (data-dependent sizes)."""


# Nodes whose value is a size: no code, the IR uses their expression.
SIZE_TARGETS = frozenset(
    {
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_stride.int,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.sym_storage_offset.default,
        operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
        torch.sym_max, torch.sym_min,
    }
)  # fmt: skip
# Checks export leaves in the graph; the input check already enforces the ranges they come from.
ASSERT_TARGETS = frozenset({torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default})


def size_of(value: Any, where: str) -> Size:
    """An int, or the `SizeExpr` of a SymInt; data-dependent sizes are a DynamicShapeError naming `where`."""
    if isinstance(value, int):
        return int(value)
    if not isinstance(value, torch.SymInt):
        raise OpgenError(f"{where}: expected a size, got {type(value).__name__}")
    expr = value.node.expr
    unbacked = [str(s) for s in expr.free_symbols if not str(s).startswith("s")]
    if unbacked:
        raise DynamicShapeError(
            f"{where}: size {expr} depends on tensor data ({', '.join(sorted(unbacked))}); opgen compiles sizes "
            "that follow from the input sizes only"
        )
    return from_expr(expr)


def is_size_node(node: torch.fx.Node) -> bool:
    """A node computing a size (a SymInt, or an int export did not fold) rather than a tensor."""
    return node.target in SIZE_TARGETS and isinstance(node.meta.get("val"), torch.SymInt | int)


def graph_symbols(gm: torch.fx.GraphModule) -> set[str]:
    """Every size symbol the graph's metas mention (reserved as local names)."""
    found: set[str] = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for item in val if isinstance(val, list | tuple) else (val,):
            if isinstance(item, torch.Tensor):
                sizes: Iterable[Any] = (*item.shape, *item.stride(), item.storage_offset())
            else:
                sizes = (item,)
            for size in sizes:
                if isinstance(size, torch.SymInt):
                    found.update(str(s) for s in size.node.expr.free_symbols)
    return found


def bindings(inputs: Iterable[Input]) -> list[SizeLet]:
    """`s27 = x.shape[1]` for each symbol that is exactly one input dimension (the first such), in input order.

    Symbols a size input already names (torch.compile's SymInt inputs) need no binding.
    """
    bound = {i.size.text for i in inputs if i.size is not None and i.size.text == i.name}
    lets = []
    for i in inputs:
        if i.size is not None:
            continue
        for d, n in enumerate(i.meta.shape):
            if isinstance(n, SizeExpr) and n.symbols == (n.text,) and n.text not in bound:
                bound.add(n.text)
                lets.append(SizeLet(n.text, f"{i.name}.shape[{d}]", (i.name,)))
    return lets


def check_bound(inputs: Iterable[Input], lets: Iterable[SizeLet], used: Iterable[str]) -> None:
    bound = {let.name for let in lets} | {i.name for i in inputs if i.size is not None}
    missing = sorted(set(used) - bound)
    if missing:
        raise DynamicShapeError(
            f"size symbols {', '.join(missing)} are not the size of any input dimension; opgen binds sizes from "
            "input dimensions (a dimension that is an expression of other sizes only constrains them)"
        )


def ranges_of(range_constraints: Mapping[Any, Any], symbols: Iterable[str]) -> tuple[SizeRange, ...]:
    """The ranges of the given symbols, from `{sympy symbol: ValueRanges}` (export's range_constraints)."""
    by_name = {str(k): v for k, v in range_constraints.items()}
    result = []
    for name in sorted(set(symbols)):
        vr = by_name.get(name)
        low = _bound(vr.lower) if vr is not None else None
        high = _bound(vr.upper) if vr is not None else None
        result.append(SizeRange(name, max(low or 1, 1), high))  # sizes >= 1 (`sizes`)
    return tuple(result)


def _bound(value: Any) -> int | None:
    """An int, or None for an infinite bound (sympy's oo, torch's int_oo)."""
    if value.is_Integer or isinstance(value, int):
        return int(value)
    return None


def shape_env_ranges(gm: torch.fx.GraphModule, symbols: Iterable[str]) -> tuple[SizeRange, ...]:
    """Ranges from the shape environment of a graph's fake values (torch.compile graphs)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        env = getattr(getattr(val, "fake_mode", None), "shape_env", None)
        if env is None and isinstance(val, torch.SymInt):
            env = val.node.shape_env
        if env is not None:
            return ranges_of(env.var_to_range, symbols)
    return tuple(SizeRange(s, 0, None) for s in sorted(set(symbols)))


def used_symbols(sizes: Iterable[Size]) -> set[str]:
    return {s for n in sizes for s in size_symbols(n)}
