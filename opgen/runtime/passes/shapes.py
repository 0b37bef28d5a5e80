"""Shape folding: shape arguments become constants wherever the metas already fix them.

- `sym_size`/`sym_stride`/`sym_numel`/`sym_storage_offset` of a value with a static meta is its
  number; integer arithmetic (`operator.mul`, ...) on numbers is folded in turn. Users get the
  literal, which the backend prints inline (a code constant: no work per call).
- `-1` in a reshape's size is replaced by the size the result's meta records.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, TensorMeta, meta_table, substitute_line
from opgen.runtime.registry import KernelRegistry

_META_QUERIES: dict[str, Callable[..., int]] = {
    "aten.sym_size.int": lambda m, d: m.shape[d],
    "aten.sym_stride.int": lambda m, d: m.stride[d],
    "aten.sym_numel.default": lambda m: m.numel,
    "aten.sym_storage_offset.default": lambda m: m.offset,
}
_INT_OPS: dict[str, Callable[..., int]] = {
    "py:_operator.add": operator.add, "py:_operator.sub": operator.sub, "py:_operator.mul": operator.mul,
    "py:_operator.floordiv": operator.floordiv, "py:_operator.mod": operator.mod, "py:_operator.neg": operator.neg,
}  # fmt: skip
RESHAPES = frozenset({"view", "_unsafe_view", "reshape"})


def _fold(line: KernelCall, metas: dict[str, TensorMeta]) -> int | None:
    """The number a shape query or integer op computes, if the program already knows it."""
    if line.kwargs or len(line.outputs) != 1:
        return None
    if line.kernel in _META_QUERIES:
        tensor, *rest = line.args
        meta = metas.get(tensor.name) if isinstance(tensor, Ref) else None
        if meta is None or not all(isinstance(r, int) for r in rest):
            return None
        return int(_META_QUERIES[line.kernel](meta, *rest))
    if line.kernel in _INT_OPS and all(isinstance(a, int) and not isinstance(a, bool) for a in line.args):
        return int(_INT_OPS[line.kernel](*line.args))
    return None


def _resolve_reshape(line: KernelCall) -> KernelCall:
    out = line.outputs[0] if len(line.outputs) == 1 else None
    if (
        len(line.args) < 2
        or not isinstance(line.args[1], tuple)
        or -1 not in line.args[1]
        or out is None
        or out.meta is None
    ):
        return line
    return replace(line, args=(line.args[0], out.meta.shape, *line.args[2:]))


def fold_shapes(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    mapping: dict[str, Arg] = {}
    body: list[Line] = []
    for line in program.body:
        line = substitute_line(line, mapping)
        if isinstance(line, KernelCall) and line.fallback and line.outputs and line.outputs[0] is not None:
            value = _fold(line, metas)
            if value is not None:
                mapping[line.outputs[0].name] = value
                continue
        if isinstance(line, KernelCall) and line.kernel in RESHAPES and not line.fallback:
            line = _resolve_reshape(line)
        body.append(line)
    return replace(program, body=tuple(body))
