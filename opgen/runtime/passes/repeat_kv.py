"""Grouped key/value heads repeated for attention: find the repeat, to read the heads in place instead.

Grouped-query models (Llama, Qwen2, Mistral, ...) keep fewer key/value heads than query heads and copy
each one for its group before attention: `repeat_kv` in transformers, `repeat_interleave` in gpt-fast,
both `view(clone(expand(unsqueeze(kv, 2), [B, KVH, G, S, D])))` once exported: a copy of every key and
value, per layer (with one key/value head, no copy: `view(expand(...))`, every query head reading the same
cache). The decode-attention kernel and the grouped SDPA call read `kv` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from opgen.runtime.ir import KernelCall, Line, Ref, TensorMeta, contiguous_strides

RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


@dataclass(frozen=True, slots=True)
class Operand:
    """A tensor an attention kernel reads: its value and meta."""

    name: str
    meta: TensorMeta


def unrepeat(operand: Operand, body: tuple[Line, ...], metas: dict[str, TensorMeta], producers: dict[str, int],
              read_by: dict[str, set[int]], sdpa: int, members: list[int]) -> tuple[Operand, int]:  # fmt: skip
    """(the cache, heads per cache head) for `view(clone(expand(unsqueeze(cache, 2), [B, KVH, G, S, D])))`, read
    by nothing but the attention; else (the operand itself, 1). The repeat's lines go to `members`. With one
    key/value head (multi-query attention: Gemma-2B's) the reshape views the expanded cache, heads 0 apart, and
    export records no clone: `view(expand(unsqueeze(cache, 2)))` is the same repeat."""
    chain: list[int] = []
    name = operand.name
    expand_at = None
    for targets in (RESHAPES, ("aten.clone.default",), ("aten.expand.default",), ("aten.unsqueeze.default",)):
        at = producers.get(name)
        line = body[at] if at is not None else None
        if targets == ("aten.clone.default",) and isinstance(line, KernelCall) and line.target != targets[0]:
            continue  # no copy: the reshape views the expand (one key/value head)
        if not isinstance(line, KernelCall) or line.target not in targets or not line.args:
            return operand, 1
        if read_by.get(name) != {chain[-1] if chain else sdpa} or not isinstance(line.args[0], Ref):
            return operand, 1
        if line.target == "aten.clone.default" and not _contiguous(metas[name]):
            return operand, 1  # the view after it assumes the repeat's dense layout
        if line.target == "aten.unsqueeze.default" and line.args[1:] != (2,):
            return operand, 1
        if line.target == "aten.expand.default":
            expand_at = at
        chain.append(at)  # type: ignore[arg-type]
        name = line.args[0].name
    root = metas.get(name)
    expanded = metas.get(_output(body[expand_at])) if expand_at is not None else None
    if root is None or expanded is None or len(root.shape) != 4 or len(expanded.shape) != 5:
        return operand, 1
    b, kvh, s, d = root.shape
    group = expanded.shape[2]
    if expanded.shape != (b, kvh, group, s, d) or operand.meta.shape != (b, kvh * group, s, d):  # type: ignore[operator]
        return operand, 1
    members.extend(chain)
    return Operand(name, root), int(group)  # type: ignore[arg-type]


def _contiguous(meta: TensorMeta) -> bool:
    return tuple(meta.stride) == contiguous_strides(meta.shape)  # type: ignore[arg-type]


def _output(line: Line) -> str:
    assert isinstance(line, KernelCall) and line.outputs[0] is not None
    return line.outputs[0].name
