"""Linear layers of MIN_ROWS to MAX_ROWS rows run through MKL's packed sgemm, the weight packed once at bind time.

`addmm(b, x, permute(W, (1, 0)))` and `mm(x, permute(W, (1, 0)))` with a constant float32 CPU weight
(`prepack.linear_parts`) and a static row count from MIN_ROWS up to (not including) MAX_ROWS become
`kernel_ops.mkl_linear(x, packed, W, b, rows)`, `packed` computed in setup by
`mkl._mkl_reorder_linear_weight(W, rows)`: what Inductor runs for float32 linears under freezing.
MKL's plain sgemm (addmm) packs the weight on every call, and oneDNN's linear pays a fixed cost per
call; the packed sgemm does neither. Measured on 1 thread of this kind of machine (us, addmm /
oneDNN packed / MKL packed): 8x1024 @ 1024x256 30.5 / 36.2 / 21.7, 16x256 @ 256x1024 70.6 / 51.6 /
41.5, 128x1024 @ 1024x1024 1518 / 1443 / 1380. Below MIN_ROWS rows, with the weights out of cache as
in a model (a chain of 12 linear layers of width 256), MKL's plain sgemm streams them better: one row
127 us against 144 packed, two rows a tie, four rows 161 against 129; a decode step (one row) ran
1.6x slower packed. From 256 rows
oneDNN wins some shapes (256x256 @ 256x1024: 686 / 631 / 652), so those stay with `prepack`, which
runs after this pass, as do symbolic row counts (a weight packed by MKL serves the row count it was
packed for; others take a plain product). MKL has no post-ops: an activation after the product
stays its own call (gelu on 16x1024: 11 us, where oneDNN's fused gelu cost 7 us more than its
linear; the linear saves 10). The pipeline runs this pass only where torch has MKL
(`opgen.runtime.pipeline.default_pipeline`).
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, Value, meta_table, producers
from opgen.runtime.passes.analysis import constant_names, fresh_namer
from opgen.runtime.passes.prepack import linear_parts
from opgen.runtime.registry import KernelRegistry

PACK = "mkl._mkl_reorder_linear_weight.default"
LINEAR = "mkl_linear"  # a kernel_ops function (ops.yaml)
MIN_ROWS, MAX_ROWS = 4, 256


def pack_linear_mkl(program: Program, registry: KernelRegistry) -> Program:
    if LINEAR not in registry.by_name:  # a kernel_ops built without it
        return program
    constant, metas = constant_names(program), meta_table(program)
    made = producers((*program.setup, *program.body))
    names = fresh_namer(program, "mkl_packed")
    setup, body = list(program.setup), list[Line]()
    packed: dict[tuple[str, int], str] = {}
    for line in program.body:
        parts = linear_parts(line, made, constant, metas)
        rows = _static_rows(line) if parts is not None else None
        if parts is None or rows is None:
            body.append(line)
            continue
        assert isinstance(line, KernelCall)
        bias, x, weight = parts
        if (weight, rows) not in packed:
            packed[weight, rows] = next(names)
            out = (Value(packed[weight, rows]),)
            setup.append(KernelCall(PACK, (Ref(weight), rows), (), out, line.node, PACK, fallback=True, fresh=True))
        args: tuple[Arg, ...] = (x, Ref(packed[weight, rows]), Ref(weight), Ref(bias) if bias else None, rows)
        body.append(replace(line, kernel=LINEAR, args=args, target=f"{line.target} as {LINEAR}", fresh=True))
    return replace(program, setup=tuple(setup), body=tuple(body))


def _static_rows(line: Line) -> int | None:
    """The row count of a linear layer's (2-d) result, if it is static and in [MIN_ROWS, MAX_ROWS)."""
    assert isinstance(line, KernelCall) and line.outputs[0] is not None and line.outputs[0].meta is not None
    rows = line.outputs[0].meta.shape[0]
    return rows if type(rows) is int and MIN_ROWS <= rows < MAX_ROWS else None
