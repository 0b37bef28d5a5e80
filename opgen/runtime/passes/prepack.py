"""Linear layers with constant weights run through oneDNN with the weight packed once, at bind time.

`addmm(b, x, permute(W, (1, 0)))` and `mm(x, permute(W, (1, 0)))` with a constant float32 CPU
weight become `kernel_ops.mkldnn_linear_pointwise(x, packed, b, "none", (), "")`, `packed` computed in setup by
`mkldnn._reorder_linear_weight(W, rows)`. On this kind of machine that is 10-40% faster than MKL's
sgemm for 8 rows and more on large products (16x256 @ 256x1024: 98 us against 122 us), and slower on
small ones (32x128 @ 128x128: 22 us against 14), so products under MIN_MACS multiply-adds (rows x
in x out, the rows at their range's upper bound) with a weight under MIN_WEIGHT elements stay as they
are, as do single-row ones. A symbolic row count (dynamic shapes) is packed for the
largest row count its range allows (packing for 8 rows runs 256 rows 1.7x slower than packing for
256; for small counts the largest costs nothing) and calls `opgen.runtime.execution.linear_rows.linear`,
which takes the oneDNN path from MIN_ROWS rows and the plain product below, per call (its post-ops
are relu and gelu only); where the rows are one size symbol, the program records the split
(`Program.splits`) and `opgen.compile` compiles the range below MIN_ROWS and the rest apart
(`opgen.runtime.execution.size_classes`), so that each decides here: a range below MIN_ROWS keeps the
product (planned into persistent buffers like a static one), a range from MIN_ROWS up calls oneDNN
directly. An activation (relu, gelu, silu, sigmoid, tanh, hardswish,
hardsigmoid, leaky_relu, hardtanh) that is the only reader of the result becomes the call's post-op
(another 7 us for gelu on that product), and so does a residual `add` of a same-shaped contiguous
tensor (`kernel_ops.mkldnn_linear_pointwise_binary(x, z, packed, b, "add")`). These are kernel_ops
functions calling torch's at::native oneDNN functions directly (no dispatcher); only the packing, in
setup, goes through torch.ops (`compiled.report()` lists it). The pipeline runs
this pass only where oneDNN is available (`opgen.runtime.pipeline.default_pipeline`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from opgen.runtime.ir import (
    Alloc,
    Arg,
    KernelCall,
    Line,
    Program,
    Ref,
    SizeExpr,
    TensorMeta,
    Value,
    meta_table,
    producers,
    uses,
)
from opgen.runtime.ir.sizes import lower_bound, upper_bound
from opgen.runtime.passes.analysis import constant_names, escaping, fresh_namer, use_counts
from opgen.runtime.passes.onednn import unary_post_op
from opgen.runtime.registry import KernelRegistry

Ranges = tuple[tuple[str, int, int | None], ...]

PACK = "mkldnn._reorder_linear_weight.default"
LINEAR = "mkldnn_linear_pointwise"  # kernel_ops functions (ops.yaml)
BINARY = "mkldnn_linear_pointwise_binary"
LINEAR_ROWS = "py:opgen.runtime.execution.linear_rows.linear"  # the same arguments + the transposed weight
ROWS_POST_OPS = ("relu", "gelu")  # what linear_rows applies itself below MIN_ROWS
MIN_ROWS = 8
# oneDNN's linear pays a fixed cost per call that MKL's sgemm (addmm) does not, so it only wins on
# larger products. Measured on 1 thread of this kind of machine, packed oneDNN against addmm: 32x128 @
# 128x128 22 us against 14 (30 against 19 under load), 64x128 @ 128x256 50 against 46, a tie at 2^21
# multiply-adds (32x256 @ 256x256: 51 against 50); from 2^22 it wins or ties at every shape tried
# (32x512 @ 512x512: 170 against 200, 223 against 434 under load; 1024x128 @ 128x128: 313 against
# 339; 256x128 @ 128x128: 87 against 88). A large weight wins from MIN_ROWS rows at any product size,
# MKL streaming it badly for few rows (8x256 @ 256x512: 34 against 39; 16x256 @ 256x768: 73 against
# 89; a GPT block of 8 tokens, width 256: 0.55x eager packed, 0.70x on addmm). So a linear is packed
# from MIN_MACS rows x in x out or from MIN_WEIGHT weight elements, and below both stays addmm/mm: the
# zoo's transformers (hidden size 128, 32 tokens) run 0.28-0.44x eager so, 0.42-0.62x all packed.
MIN_MACS = 1 << 22
MIN_WEIGHT = 1 << 17


def _transposed_weight(
    arg: Arg, producers: dict[str, KernelCall], constant: set[str], metas: dict[str, TensorMeta]
) -> str | None:
    """W if `arg` is `permute(W, (1, 0))` or `t(W)` of a constant 2-d float32 CPU weight."""
    line = producers.get(arg.name) if isinstance(arg, Ref) else None
    if line is None or line.kernel not in ("permute", "t") or (line.kernel == "permute" and line.args[1:] != ((1, 0),)):
        return None
    weight = line.args[0]
    if not isinstance(weight, Ref) or weight.name not in constant or weight.name not in metas:
        return None
    meta = metas[weight.name]
    if len(meta.shape) != 2 or meta.dtype != "float32" or meta.device != "cpu" or not meta.is_contiguous():
        return None
    return weight.name


def _operands(
    line: KernelCall, rows: tuple[int, ...], metas: dict[str, TensorMeta]
) -> tuple[str | None, Arg, Arg] | None:
    """(bias, x, transposed weight) of `addmm(bias, x, w)` or `mm(x, w)`."""
    if line.kernel == "mm" and len(line.args) == 2:
        return None, line.args[0], line.args[1]
    if line.kernel != "addmm" or len(line.args) != 3:
        return None
    bias, x, w = line.args
    if not isinstance(bias, Ref) or bias.name not in metas or metas[bias.name].shape != rows:
        return None
    return bias.name, x, w


def linear_parts(
    line: Line, producers: dict[str, KernelCall], constant: set[str], metas: dict[str, TensorMeta]
) -> tuple[str | None, Arg, str] | None:
    """(bias, x, W) if the call is a linear layer on a constant float32 CPU weight W: `addmm(b, x,
    permute(W, (1, 0)))` or `mm(x, permute(W, (1, 0)))`, with a 2-d contiguous x and result."""
    if not isinstance(line, KernelCall) or line.kernel not in ("addmm", "mm") or line.fallback or line.kwargs:
        return None
    out = line.outputs[0] if len(line.outputs) == 1 else None
    if out is None or out.meta is None or len(out.meta.shape) != 2 or not out.meta.is_contiguous():
        return None
    operands = _operands(line, out.meta.shape[1:], metas)
    if operands is None:
        return None
    bias, x, w = operands
    weight = _transposed_weight(w, producers, constant, metas)
    x_meta = metas.get(x.name) if isinstance(x, Ref) else None
    if weight is None or x_meta is None or len(x_meta.shape) != 2 or not x_meta.is_contiguous():
        return None
    return bias, x, weight


def _linear(
    line: Line, producers: dict[str, KernelCall], constant: set[str], metas: dict[str, TensorMeta], ranges: Ranges
) -> tuple[str | None, str] | None:
    """(bias, weight) if the call is a linear layer this pass rewrites."""
    parts = linear_parts(line, producers, constant, metas)
    if parts is None:
        return None
    assert isinstance(line, KernelCall) and line.outputs[0] is not None and line.outputs[0].meta is not None
    most = upper_bound(line.outputs[0].meta.shape[0], ranges)
    if most is not None and most < MIN_ROWS:  # fewer rows than MIN_ROWS in the whole range
        return None
    bias, _, weight = parts
    return (bias, weight) if _large(most, metas[weight].shape) else None


def _large(rows: int | None, weight_shape: tuple[object, ...]) -> bool:
    """Whether oneDNN beats addmm here: `rows` (None: unbounded, taken as large) x the weight's elements."""
    elements = math.prod(weight_shape)  # type: ignore[arg-type]  # a constant: static
    return elements >= MIN_WEIGHT or rows is None or rows * elements >= MIN_MACS


def prepack_linear(program: Program, registry: KernelRegistry) -> Program:
    if not {LINEAR, BINARY} <= set(registry.by_name):  # a kernel_ops built without them
        return program
    constant, metas = constant_names(program), meta_table(program)
    made = producers((*program.setup, *program.body))
    names = fresh_namer(program, "packed")
    setup, body = list(program.setup), []
    packed: dict[str, str] = {}
    scratches, escapes = fresh_namer(program, "scratch"), escaping(program, registry)
    splits = dict.fromkeys(program.splits)
    for line in program.body:
        match = _linear(line, made, constant, metas, program.ranges)
        if match is None:
            body.append(line)
            continue
        bias, weight = match
        assert isinstance(line, KernelCall) and line.outputs[0] is not None and line.outputs[0].meta is not None
        if weight not in packed:
            packed[weight] = next(names)
            rows = upper_bound(line.outputs[0].meta.shape[0], program.ranges)
            pack_out = (Value(packed[weight]),)
            setup.append(
                KernelCall(PACK, (Ref(weight), rows), (), pack_out, line.node, PACK, fallback=True, fresh=True)
            )
        x = line.args[1] if line.kernel == "addmm" else line.args[0]
        args: tuple[Arg, ...] = (x, Ref(packed[weight]), Ref(bias) if bias else None, "none", (), "")
        least = lower_bound(line.outputs[0].meta.shape[0], program.ranges)
        kernel = LINEAR if least is not None and least >= MIN_ROWS else LINEAR_ROWS
        if kernel == LINEAR_ROWS:  # + the transposed weight and a buffer for the rows below MIN_ROWS
            scratch = _scratch(line.outputs[0], escapes, next(scratches))
            setup += [scratch] if scratch is not None else []
            args += (line.args[-1], Ref(scratch.value.name) if scratch is not None else None)
            rows = line.outputs[0].meta.shape[0]
            if isinstance(rows, SizeExpr) and rows.symbols == (rows.text,):  # the rows are one size symbol
                splits[(rows.text, MIN_ROWS)] = None
        target = f"{line.target} as {kernel}"
        body.append(replace(line, kernel=kernel, args=args, target=target, fallback=kernel == LINEAR_ROWS, fresh=True))
    body_ = fuse_activations(tuple(body), registry, metas)
    return replace(program, setup=tuple(setup), body=body_, splits=tuple(splits))


def _scratch(out: Value, escapes: set[str], name: str) -> Alloc | None:
    """A buffer of MIN_ROWS - 1 rows for a linear of symbolic rows whose result stays inside the call."""
    meta = out.meta
    if meta is None or out.name in escapes or type(meta.shape[1]) is not int:
        return None
    cols = meta.shape[1]
    return Alloc(Value(name, TensorMeta((MIN_ROWS - 1, cols), (cols, 1), meta.dtype, meta.device)))


def fuse_activations(
    body: tuple[Line, ...], registry: KernelRegistry, metas: dict[str, TensorMeta]
) -> tuple[Line, ...]:
    """An activation (`onednn.UNARY`) or a residual add that is the only reader of a linear becomes its post-op."""
    counts = use_counts(body)
    lines: list[Line | None] = list(body)
    for i, line in enumerate(body):
        if not isinstance(line, KernelCall) or line.kernel not in (LINEAR, LINEAR_ROWS) or line.args[3] != "none":
            continue
        rows = line.kernel == LINEAR_ROWS
        source = line.outputs[0].name if line.outputs[0] is not None else ""
        user = next((j for j in range(i + 1, len(body)) if source in uses(body[j])), None)
        reader = body[user] if user is not None and counts[source] == 1 else None
        if reader is None or not isinstance(reader, KernelCall):
            continue
        post = unary_post_op(reader, source, registry)
        if post is not None and (not rows or post[0] in ROWS_POST_OPS):
            args = (*line.args[:3], *post, *line.args[6:])
            fused = replace(line, args=args, target=f"{line.target}+{reader.kernel}")
        elif not rows and (other := _residual(reader, source, metas)) is not None:
            x, weight, bias = line.args[:3]
            fused = replace(line, kernel=BINARY, args=(x, other, weight, bias, "add"), target=f"{line.target}+add")
            fused = replace(fused, target=fused.target.replace(LINEAR, BINARY))
        else:
            continue
        lines[i] = replace(fused, outputs=reader.outputs, node=f"{line.node}+{reader.node}")
        lines[user] = None  # type: ignore[index]
    return tuple(line for line in lines if line is not None)


def _residual(add: KernelCall, source: str, metas: dict[str, TensorMeta]) -> Ref | None:
    """`z` if `add` is `source + z` or `z + source` with a contiguous `z` of the same shape (alpha 1)."""
    if add.kernel != "add" or add.fallback or len(add.args) != 2 or dict(add.kwargs).get("alpha", 1) != 1:
        return None
    a, b = add.args
    z = b if a == Ref(source) else a if b == Ref(source) else None
    meta = metas.get(z.name) if isinstance(z, Ref) and z.name != source else None
    out = add.outputs[0].meta if len(add.outputs) == 1 and add.outputs[0] is not None else None
    if meta is None or out is None or meta.shape != out.shape or meta.dtype != "float32" or not meta.is_contiguous():
        return None
    return z  # type: ignore[return-value]
