"""Product weights stored [K, N] row-major (GPT-2's `Conv1D`), copied once in setup into a linear layer's
layout, so that the few-row product kernels take their products.

`nn.Linear` keeps its weight as [N, K], and the graph multiplies by its transpose: [K, N] with K
contiguous, each output's weights one run of memory, which is what the matrix-vector and few-row
kernels of `gemv` read. GPT-2's `Conv1D` keeps [K, N] and multiplies by it as it is (`addmm(b, x, W)`):
N is contiguous, so its four products a layer stay with cuBLAS. Here each such constant weight gets a
copy in setup with K contiguous (`permute(clone(permute(W)))`: the same values, another layout), and
its few-row products read the copy; the `gemv` pass then takes them like any linear layer's.

The copy costs the memory of those weights once more (the program's notes and `report()` say how
much), for the life of the compiled function; it is made when the function is bound and never
refreshed, like every folded constant. Only products `gemv` would take in that layout are changed:
CUDA, static sizes, one to 64 rows, float16/bfloat16/float32.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import ITEMSIZE, KernelCall, Line, Program, Ref, Sym, Value, meta_table, substitute_line
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.passes.fusion.gemv import PRODUCTS, product_of
from opgen.runtime.registry import KernelRegistry


def transpose_weights(program: Program, registry: KernelRegistry) -> Program:
    if not {"permute", "clone"} <= set(registry.by_name):
        return program
    metas = meta_table(program)
    constant = {c.name for c in program.constants if not c.mutable}
    names = fresh_namer(program, "weight_kn")
    copies: dict[str, str] = {}  # weight -> its copy
    setup: list[Line] = list(program.setup)
    body = list(program.body)
    for index, line in enumerate(program.body):
        if not isinstance(line, KernelCall) or line.target not in PRODUCTS or not line.args:
            continue
        w = line.args[-1]
        meta = metas.get(w.name) if isinstance(w, Ref) and w.name in constant else None
        if meta is None or len(meta.shape) != 2 or not meta.is_static or meta.stride != (meta.shape[1], 1):
            continue
        k, n = meta.shape
        laid = replace(meta, stride=(1, k), offset=0)  # [K, N], K contiguous: a linear layer's transpose
        if k == 1 or n == 1 or product_of(index, line, {**metas, w.name: laid}, constant) is None:  # type: ignore[union-attr]
            continue
        if w.name not in copies:  # type: ignore[union-attr]
            t, c, copy = next(names), next(names), next(names)
            copies[w.name] = copy  # type: ignore[union-attr]
            contiguous = (("memory_format", Sym("memory_format", "contiguous_format")),)
            setup += [
                KernelCall("permute", (w, (1, 0)), (), (Value(t, replace(meta, shape=(n, k), stride=(1, n))),),
                           line.node, "aten.permute.default"),
                KernelCall("clone", (Ref(t),), contiguous, (Value(c, replace(meta, shape=(n, k), stride=(k, 1))),),
                           line.node, "aten.clone.default"),
                KernelCall("permute", (Ref(c), (1, 0)), (), (Value(copy, laid),), line.node, "aten.permute.default"),
            ]  # fmt: skip
        body[index] = substitute_line(line, {w.name: Ref(copies[w.name])})  # type: ignore[union-attr]
    if not copies:
        return program
    size = sum(metas[w].numel * ITEMSIZE[metas[w].dtype] for w in copies)
    note = (f"product weights stored [K, N] ({len(copies)}, {size / 2**20:.1f} MiB) copied once into a linear "
            "layer's layout for the few-row product kernels (`transpose_weights`)")  # fmt: skip
    return replace(program, setup=tuple(setup), body=tuple(body), notes=(*program.notes, note))
