"""Fused projections taken apart: a few-row product on a constant weight whose result is only split
along its columns becomes one product per piece, each on its piece of the weight's columns.

Phi-3 keeps its MLP's gate and up weights in one matrix: `gate_up = x @ W`, split in two halves along
the last dimension, then `silu(gate) * up`. Llama-family models have two matrices, and the `gemv` pass
makes their two products one kernel that writes `silu(gate) * up` alone (`gemv_gated`). Here the one
product becomes the two that Llama's graph has, `x @ W[:, :n]` and `x @ W[:, n:]`, the weight's
pieces views made once in setup (no copy: a piece of a transposed linear weight's columns is a run of
its rows). `gemv` then finds them as siblings over one input and takes the pair as Llama's, so the
split's halves never reach memory and the pointwise kernel after them is gone.

Only what `gemv` takes is split (`mm` of a few rows on a constant weight, CUDA, static sizes), read
only through reshapes that keep the columns, then one `split`/`split_with_sizes` of the last dimension
whose pieces are each read, and only by pointwise calls (whose outputs are fresh, so no view keeps the
pieces' old strides). Its siblings' kernel computes what the one product did: each output element is
the same dot product of a row of x with a column of W.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from opgen.runtime.ir import KernelCall, Line, Program, Ref, TensorMeta, Value, meta_table
from opgen.runtime.passes.analysis import RESHAPES, constant_names, fresh_namer, readers
from opgen.runtime.passes.fusion.gemv import MAX_PRODUCTS, product_of
from opgen.runtime.registry import KernelRegistry

SPLITS = ("aten.split.Tensor", "aten.split_with_sizes.default")


@dataclass(frozen=True, slots=True)
class Split:
    """A product read only as pieces of its columns: where its lines are and what each piece is."""

    product: int  # body index of the mm
    chain: tuple[int, ...]  # the reshapes between it and the split, then the split
    pieces: tuple[Value, ...]  # the split's outputs, in column order
    columns: tuple[int, ...]  # the first column of each piece


def split_products(program: Program, registry: KernelRegistry) -> Program:
    if not {"mm", "slice", "view"} <= set(registry.by_name):
        return program
    found = list(_splits(program))
    if not found:
        return program
    metas = meta_table(program)
    names = fresh_namer(program, "piece")
    setup: list[Line] = list(program.setup)
    replaced: dict[int, list[Line]] = {}
    for split in found:
        mm: KernelCall = program.body[split.product]  # type: ignore[assignment]
        split_node = program.body[split.chain[-1]].node  # type: ignore[union-attr]  # the views stand for the split
        x, w = mm.args
        w_meta = metas[w.name]  # type: ignore[union-attr]
        k, rows = w_meta.shape[0], metas[x.name].shape[0]  # type: ignore[union-attr]
        products: list[Line] = []
        views: list[Line] = []
        for piece, first in zip(split.pieces, split.columns, strict=True):
            n = piece.meta.shape[-1]  # type: ignore[union-attr]
            w_piece = Value(next(names), replace(w_meta, shape=(k, n), offset=w_meta.offset + first * w_meta.stride[1]))
            setup.append(KernelCall("slice", (w, 1, first, first + n), (), (w_piece,), mm.node, "aten.slice.Tensor"))
            out = Value(next(names), w_meta.with_shape((rows, n)))
            products.append(KernelCall("mm", (x, Ref(w_piece.name)), (), (out,), mm.node, "aten.mm.default"))
            shaped = Value(piece.name, w_meta.with_shape(piece.meta.shape))  # type: ignore[union-attr]
            views.append(KernelCall("view", (Ref(out.name), piece.meta.shape), (), (shaped,), split_node,  # type: ignore[union-attr]
                                    "aten.view.default"))  # fmt: skip
        replaced[split.product] = [*products, *views]
        replaced.update((i, []) for i in split.chain)
    body = tuple(new for i, line in enumerate(program.body) for new in replaced.get(i, [line]))
    return replace(program, setup=tuple(setup), body=body)


def _splits(program: Program) -> Iterator[Split]:
    metas = meta_table(program)
    constant = constant_names(program)
    read_by = readers(program.body)
    body = program.body
    for index, line in enumerate(body):
        if not isinstance(line, KernelCall) or line.target != "aten.mm.default":
            continue
        product = product_of(index, line, metas, constant)
        if product is None:
            continue
        chain, value = [], product.line.outputs[0].name  # type: ignore[union-attr]
        while len(at := read_by.get(value, set())) == 1:
            (reader,) = at
            step = body[reader]
            if not isinstance(step, KernelCall) or step.args[:1] != (Ref(value),) or len(step.outputs) < 1:
                break
            chain.append(reader)
            if step.target not in RESHAPES:
                break
            value = step.outputs[0].name  # type: ignore[union-attr]
            if metas[value].shape[-1] != product.n:
                break  # the reshape moved the columns
        else:
            continue
        split = _pieces(body[chain[-1]], metas[value], product.n, body, read_by) if chain else None
        if split is not None and 2 <= len(split) <= MAX_PRODUCTS:
            yield Split(index, tuple(chain), tuple(v for v, _ in split), tuple(c for _, c in split))


def _pieces(
    line: Line, whole: TensorMeta, n: int, body: tuple[Line, ...], read_by: dict[str, set[int]]
) -> list[tuple[Value, int]] | None:
    """(piece, its first column) for each output of `line`, a split of `whole`'s last dimension whose
    pieces are read only by pointwise calls; None otherwise."""
    if not isinstance(line, KernelCall) or line.target not in SPLITS or line.mutates or line.fallback:
        return None
    dim = line.args[2] if len(line.args) > 2 else dict(line.kwargs).get("dim", 0)
    if dim not in (-1, len(whole.shape) - 1) or whole.stride[-1] != 1:
        return None
    pieces = []
    for out in line.outputs:
        if out is None or out.meta is None or not out.meta.is_static:
            return None
        at = read_by.get(out.name, set())
        if not at or not all(isinstance(body[i], KernelCall) and body[i].pointwise for i in at):  # type: ignore[union-attr]
            return None
        pieces.append((out, int(out.meta.offset) - int(whole.offset)))  # type: ignore[call-overload]
    if sum(int(p.meta.shape[-1]) for p, _ in pieces) != n:  # type: ignore[union-attr, call-overload]
        return None
    return pieces
