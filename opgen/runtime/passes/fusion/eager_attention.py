"""Attention written out by hand (transformers' `eager_attention_forward`), found for the decode-attention
kernel: `softmax(q @ k^T * scale [soft-capped] [+ mask]) @ v` as its ATen calls.

Gemma-2 soft-caps its scores (`cap * tanh(s / cap)`), which no `scaled_dot_product_attention` does, so
transformers runs its attention as plain products: per layer a `bmm` of the query by the keys (after
`repeat_kv`'s copy of the cache), the scale, the cap's division, `tanh` and product, the mask's add, a
float32 softmax and its cast back, and a `bmm` by the values. Here that chain, anchored at its second
`bmm`, is read backwards to the query, key, value and mask it starts from. `passes.fusion.attention` then
checks it as it checks an SDPA call (one query row, a static cache, the repeat read in place) and makes it
the same kernel, with the cap applied to the float32 scores in the kernel.

What the chain may hold, in order: the keys' transpose (a `permute` or `transpose` of the last two
dimensions) and the reshapes to the products' 3-d operands (`view`, `reshape`, an `expand` that repeats
nothing); the scale as a product or quotient by a number (none: 1); the cap as a quotient, `tanh` and
product by one number; an additive mask; casts to float32 around `_softmax` of the last dimension, or on
CUDA in float16 a `_softmax(s, -1, half_to_float=True)` that casts as it goes (what `F.softmax(s,
dtype=torch.float32)` dispatches to there); a `clone` (eval-mode dropout). Every value in it must be read
only by the next line of the chain, so that replacing the chain drops nothing that something else reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from opgen.runtime.ir import KernelCall, Line, Ref, TensorMeta
from opgen.runtime.passes.analysis import RESHAPES
from opgen.runtime.passes.repeat_kv import Operand

BMM = "aten.bmm.default"
MUL, DIV, ADD = "aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor"
TANH, SOFTMAX, CAST, CLONE = "aten.tanh.default", "aten._softmax.default", "aten._to_copy.default", "aten.clone.default"
TRANSPOSES = ("aten.permute.default", "aten.transpose.int")


@dataclass(frozen=True, slots=True)
class EagerAttention:
    """One chain: its operands, the scale and cap it applies, and the lines it is."""

    out: int  # body index of the reshape of the second product to [B, H, 1, D]: the attention's output
    query: Operand  # [B, H, 1, D]
    key: Operand  # [B, H, S, D] (maybe a repeat of the cache)
    key_reader: int  # the line of the chain that reads it (the transpose)
    value: Operand
    value_reader: int
    mask: Operand | None
    scale: float
    softcap: float | None
    members: tuple[int, ...]  # body indices of the chain's lines, in order


class _Chain:
    """Walks a chain backwards from a value, through the lines that define it."""

    def __init__(self, body: tuple[Line, ...], metas: dict[str, TensorMeta], producers: dict[str, int]) -> None:
        self.body, self.metas, self.producers = body, metas, producers
        self.members: list[int] = []

    def line(self, name: str, *targets: str) -> KernelCall | None:
        """The call defining `name` where it is one of `targets` and reads a value first; it joins the chain."""
        at = self.producers.get(name)
        line = self.body[at] if at is not None else None
        if not isinstance(line, KernelCall) or line.target not in targets or not line.args:
            return None
        if not isinstance(line.args[0], Ref) or len(line.outputs) != 1 or line.mutates or line.fallback:
            return None
        self.members.append(at)  # type: ignore[arg-type]
        return line

    def through_reshapes(self, name: str) -> tuple[str, int | None]:
        """(the first 4-d value before the reshapes and repeat-free expands that lead to `name`, the index of
        the one that reads it: None where there are none)."""
        reader = None
        while len(self.metas[name].shape) != 4:
            at = self.producers.get(name)
            line = self.line(name, *RESHAPES, "aten.expand.default")
            if line is None:
                return name, reader
            source = line.args[0].name  # type: ignore[union-attr]
            if line.target == "aten.expand.default" and self.metas[source].shape != self.metas[name].shape:
                self.members.pop()
                return name, reader
            name, reader = source, at
        return name, reader

    def number(self, line: KernelCall) -> float | None:
        """The number a `mul`/`div` of a value by a number takes."""
        if len(line.args) != 2 or line.kwargs or not isinstance(line.args[1], int | float):
            return None
        return float(line.args[1])


def match_eager(index: int, line: KernelCall, body: tuple[Line, ...], metas: dict[str, TensorMeta],
                producers: dict[str, int], read_by: dict[str, set[int]]) -> EagerAttention | None:  # fmt: skip
    """The chain whose second product is `line` (at `index`), or None."""
    if line.target != BMM or len(line.args) != 2 or not all(isinstance(a, Ref) for a in line.args):
        return None
    at = read_by.get(line.outputs[0].name, set()) if line.outputs and line.outputs[0] else set()  # type: ignore[union-attr]
    out_line = body[min(at)] if len(at) == 1 else None
    if not isinstance(out_line, KernelCall) or out_line.target not in RESHAPES or out_line.outputs[0] is None:
        return None
    if len(metas[out_line.outputs[0].name].shape) != 4:
        return None
    chain = _Chain(body, metas, producers)
    chain.members += [index, min(at)]
    probs, values = (a.name for a in line.args)  # type: ignore[union-attr]
    value, value_reader = chain.through_reshapes(values)
    scores = _scores(chain, probs)
    if scores is None or value_reader is None:
        return None
    name, mask, scale, softcap = scores
    first = chain.line(name, *RESHAPES)
    product = chain.line(first.args[0].name, BMM) if first is not None else None  # type: ignore[union-attr]
    if product is None or len(product.args) != 2 or not isinstance(product.args[1], Ref):
        return None
    query, _ = chain.through_reshapes(product.args[0].name)  # type: ignore[union-attr]
    transposed, _ = chain.through_reshapes(product.args[1].name)
    key_reader = producers.get(transposed)
    transpose = chain.line(transposed, *TRANSPOSES)
    if transpose is None or not _last_two_swapped(transpose):
        return None
    key = transpose.args[0].name  # type: ignore[union-attr]
    members = set(chain.members)
    for i in members - {min(at)}:  # every value of the chain but its output is the chain's alone
        if any(not read_by.get(v.name, set()) <= members for v in body[i].outputs if v is not None):  # type: ignore[union-attr]
            return None
    operands = [query, key, value, *([mask] if mask else [])]
    if any(len(metas[o].shape) != 4 for o in operands):
        return None
    return EagerAttention(min(at), Operand(query, metas[query]), Operand(key, metas[key]), key_reader,  # type: ignore[arg-type]
                          Operand(value, metas[value]), value_reader, Operand(mask, metas[mask]) if mask else None,
                          scale, softcap, tuple(sorted(members)))  # fmt: skip


def _scores(chain: _Chain, probs: str) -> tuple[str, str | None, float, float | None] | None:
    """From the probabilities back to the products' scores: (the scores' value, the mask, scale, cap)."""
    name, _ = chain.through_reshapes(probs)
    if (clone := chain.line(name, CLONE)) is not None:
        name = clone.args[0].name  # type: ignore[union-attr]
    if (cast := chain.line(name, CAST)) is not None:
        name = cast.args[0].name  # type: ignore[union-attr]
    softmax = chain.line(name, SOFTMAX)
    if softmax is None or softmax.args[1] not in (-1, 3):
        return None
    name = softmax.args[0].name  # type: ignore[union-attr]
    half_to_float = softmax.args[2]  # CUDA's float16 softmax to float32, the cast before it done inside
    if not half_to_float and (cast := chain.line(name, CAST)) is not None:
        if chain.metas[cast.outputs[0].name].dtype != "float32":  # type: ignore[union-attr]
            return None
        name = cast.args[0].name  # type: ignore[union-attr]
    mask = None
    if (add := chain.line(name, ADD)) is not None:
        if len(add.args) != 2 or add.kwargs or not isinstance(add.args[1], Ref):
            return None
        scores, mask = add.args[0].name, add.args[1].name  # type: ignore[union-attr]
        if not _last_score_step(chain, scores):
            scores, mask = mask, scores
        name = scores
    softcap = None
    capped = chain.line(name, MUL)
    if capped is not None:
        tanh = chain.line(capped.args[0].name, TANH)  # type: ignore[union-attr]
        if tanh is None:  # a product by the scale, not the cap's
            chain.members.pop()
        else:
            divided = chain.line(tanh.args[0].name, DIV)  # type: ignore[union-attr]
            softcap = chain.number(capped)
            if divided is None or softcap is None or chain.number(divided) != softcap or not softcap > 0:
                return None
            name = divided.args[0].name  # type: ignore[union-attr]
    scale = 1.0
    if (scaled := chain.line(name, MUL, DIV)) is not None:
        number = chain.number(scaled)
        if not number:
            return None
        scale = number if scaled.target == MUL else 1.0 / number
        name = scaled.args[0].name  # type: ignore[union-attr]
    return name, mask, scale, softcap


def _last_score_step(chain: _Chain, name: str) -> bool:
    """Whether `name` is made by a call that can be the scores' last step (the cap, the scale, the product's view)."""
    at = chain.producers.get(name)
    return at is not None and isinstance(line := chain.body[at], KernelCall) and line.target in (MUL, DIV, *RESHAPES)


def _last_two_swapped(line: KernelCall) -> bool:
    if line.target == "aten.permute.default":
        return tuple(line.args[1]) == (0, 1, 3, 2)  # type: ignore[arg-type]
    return set(line.args[1:3]) in ({2, 3}, {-2, -1}, {2, -1}, {-2, 3})  # type: ignore[arg-type]
