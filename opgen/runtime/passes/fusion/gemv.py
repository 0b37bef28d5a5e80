"""Products of a few rows: `mm`/`addmm` calls on constant weights whose input has one to 64 rows,
siblings together, as one generated Triton kernel.

A decode step multiplies one row (one token) per sequence by every weight matrix of the model: each
product reads the whole matrix once, so it is bound by memory, and cuBLAS, tuned for matrices, leaves
bandwidth unused on small ones. Here the products that read the same input (the query, key and value
projections; the gate and up projections) become one kernel that reads the input once and writes
each product to its own output, and a lone product becomes a kernel of its own. One row
(batch 1) is a matrix-vector kernel (`codegen.triton.gemv`); 2 to 64 rows (batched decode, speculative
verification, small prefill chunks) take tensor-core tiles that read each weight once for every row
(`codegen.triton.few_rows`). The weights must be constants (or computed from them in setup:
`permute(W, (1, 0))`), their rows contiguous along K, as a linear layer's are.

Each kernel is a `FusedKernel` whose plan (`GemvPlan`) those printers print, bound like the fusion
pass's kernels: a multi-kernel choice
between the Triton kernel and the `mm`/`addmm` calls it replaced, timed on the first call, so this
pass never makes a product slower than cuBLAS. CUDA, static sizes, float16/bfloat16/float32 only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from opgen.runtime.ir import (
    FusedKernel,
    GemvPlan,
    GemvRows,
    KernelCall,
    Program,
    Ref,
    TensorMeta,
    defs,
    meta_table,
    substitute_line,
)
from opgen.runtime.passes.analysis import fresh_namer, readers, view_roots, writes_memory
from opgen.runtime.passes.dead_code import eliminate_dead_code
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.passes.fusion.gemv_gated import Gated, gated
from opgen.runtime.registry import KernelRegistry

PRODUCTS = ("aten.mm.default", "aten.addmm.default")
DTYPES = ("float16", "bfloat16", "float32")
MAX_PRODUCTS = 8  # siblings in one kernel
MAX_ROWS = 64  # input rows: more is a matrix product, cuBLAS's


@dataclass(frozen=True, slots=True)
class Product:
    """One `out = x @ w (+ bias)` with x of a few rows: where it was and what it reads."""

    index: int  # in the body
    line: KernelCall
    x: str
    w: str  # [K, N], stride (1, K): a constant matrix W [N, K] transposed
    bias: str | None  # [N]
    n: int
    row_stride: int  # W's (w's stride along N)
    dtype: str  # of x, w, the bias and the result alike


@dataclass(frozen=True, slots=True)
class Siblings:
    x: str
    k: int
    x_meta: TensorMeta
    products: tuple[Product, ...]


def fuse_gemv(program: Program, registry: KernelRegistry) -> Program:
    found = list(find_siblings(program))
    if not found:
        return program
    locals_ = fresh_namer(program, "gemv")
    placed = []
    dependent, read_by = registry.facts.dependent_launch, readers(program.body)
    for group in found:
        at = [p.index for p in group.products]
        elements = group.products[0].n * int(group.x_meta.shape[0])  # type: ignore[arg-type]  # static
        gate = gated([p.line for p in group.products], at, elements, program.body, read_by)
        if gate is not None and not any(p.bias for p in group.products):
            placed.append((fused_kernel(group, next(locals_), gate, dependent), [*at, *gate.members], gate.at))
        else:
            placed.append((fused_kernel(group, next(locals_), dependent=dependent), at, at[0]))
    return eliminate_dead_code(place(program, placed), registry)


def find_siblings(program: Program) -> Iterator[Siblings]:
    """Groups of few-row products over the same input, in body order; a write to memory ends them all
    (a product after it could read what the write changed)."""
    metas = meta_table(program)
    constant = {c.name for c in program.constants} | {v.name for line in program.setup for v in defs(line)}
    roots = view_roots(program.body)  # two views of one root with one layout read the same elements
    open_: dict[tuple[str, TensorMeta], list[Product]] = {}
    for index, line in enumerate(program.body):
        product = product_of(index, line, metas, constant) if isinstance(line, KernelCall) else None
        if product is not None:
            key = (roots.get(product.x, product.x), metas[product.x])
            group = open_.setdefault(key, [])
            if any(product.w == p.w or (product.bias and product.bias == p.bias) for p in group):
                yield _siblings(open_.pop(key), metas)  # one weight twice: a kernel parameter each
                group = open_.setdefault(key, [])
            group.append(product)
            if len(group) == MAX_PRODUCTS:
                yield _siblings(open_.pop(key), metas)
        elif writes_memory(line):
            yield from (_siblings(g, metas) for g in open_.values())
            open_.clear()
    yield from (_siblings(g, metas) for g in open_.values())


def _siblings(products: list[Product], metas: dict[str, TensorMeta]) -> Siblings:
    x = products[0].x
    return Siblings(x, metas[x].shape[1], metas[x], tuple(products))  # type: ignore[arg-type]


def product_of(index: int, line: KernelCall, metas: dict[str, TensorMeta], constant: set[str]) -> Product | None:
    """The product `line` (at `index`) as this pass takes it, or None: the one test of what `gemv` takes,
    which the passes that bring it products (`split_products`, `transpose_weights`) ask too."""
    if line.target not in PRODUCTS or line.kwargs or writes_memory(line):
        return None
    if len(line.outputs) != 1 or line.outputs[0] is None or not all(isinstance(a, Ref) for a in line.args):
        return None
    names = [a.name for a in line.args]  # type: ignore[union-attr]
    bias, x, w = (names[0], names[1], names[2]) if line.target == "aten.addmm.default" else (None, *names)
    out = line.outputs[0].meta
    xm, wm = metas.get(x), metas.get(w)
    if out is None or xm is None or wm is None or not all(m.is_static for m in (out, xm, wm)):
        return None
    if not out.device.startswith("cuda") or len(xm.shape) != 2 or len(wm.shape) != 2:
        return None
    (m, k), n = xm.shape, wm.shape[1]
    if not 1 <= m <= MAX_ROWS or wm.shape[0] != k:  # type: ignore[operator]
        return None
    if w not in constant or wm.stride[0] != 1 or out.dtype not in DTYPES or {xm.dtype, wm.dtype} != {out.dtype}:
        return None
    if out.shape != (m, n) or out.stride[1] != 1 or (m > 1 and out.stride[0] != n):
        return None  # the kernels store rows of n, one after another
    if xm.device != out.device or wm.device != out.device:
        return None
    if bias is not None:
        bm = metas.get(bias)
        if bias not in constant or bm is None or bm.shape != (n,) or bm.stride != (1,) or bm.dtype != out.dtype:
            return None
    return Product(index, line, x, w, bias, n, wm.stride[1], out.dtype)  # type: ignore[arg-type]


def fused_kernel(group: Siblings, local: str, gate: Gated | None = None, dependent: bool = False) -> FusedKernel:
    """The group's kernel; with `gate`, the gated pair's, writing `activation(gate) * up` alone. `dependent`:
    its weights are read before it waits for the kernel before it (`passes.dependent_launch`)."""
    products = group.products
    if gate is not None:  # the gate's weight first: the kernel's `w0`
        products = (products[gate.gate], products[1 - gate.gate])
        group = replace(group, products=products)
    weights = tuple(GemvRows(p.n, p.row_stride, p.bias is not None) for p in products)
    rows, (row_stride, x_stride) = int(group.x_meta.shape[0]), group.x_meta.stride  # type: ignore[arg-type, misc]
    plan = GemvPlan(group.k, int(x_stride), weights, gated=gate is not None, dependent=dependent, m=rows,
                    x_row_stride=int(row_stride), activation=gate.activation if gate else "silu")  # type: ignore[arg-type]  # fmt: skip
    kind, of = ("matrix-vector kernel", "one row") if rows == 1 else ("few-row kernel", f"{rows} rows")
    inputs = (group.x, *(p.w for p in products), *(p.bias for p in products if p.bias))  # the kernel's order
    same_x = {p.x: Ref(group.x) for p in products if p.x != group.x}
    lines = [substitute_line(p.line, same_x) for p in products]
    if gate is None:
        outputs = tuple(p.line.outputs[0] for p in products)
        nodes = tuple(p.line.node for p in products)
        widths = " + ".join(str(p.n) for p in products)
        describe = f"{kind}, {len(products)} product(s) of {of} of {group.k}: {widths} rows"
    else:
        outputs = (gate.out,)
        lines += gate.lines
        nodes = tuple(line.node for line in lines)
        describe = f"{kind}, {gate.activation}(gate) * up of {of} of {group.k}: {products[0].n} rows"
    return FusedKernel.make(
        local,
        plan,
        inputs=((name, products[0].dtype) for name in inputs),  # x, the weights and biases: one dtype
        outputs=outputs,  # type: ignore[arg-type]
        nodes=nodes,
        describe=describe,
        lines=lines,  # type: ignore[arg-type]
    )
