"""A program's tensors relabelled onto another device: every value's meta, and every device a call names.

How a machine without a GPU plans a CUDA program (`opgen.runtime.pipeline.plan_program`): the lowered
program is relabelled onto "cuda:0", the passes decide as they would there, and the result is relabelled
back. The tests run such plans' kernels in Triton's interpreter (`tests/runtime/fusion_interp.py`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opgen.runtime.ir import FusedKernel, Program, Sym, TensorMeta, Value


def relabel(program: Program, device: str) -> Program:
    """`program` with every meta on `device`, and every device argument of its calls (setup's buffers of a
    split attention kernel name theirs) that device."""

    def meta(m: TensorMeta | None) -> TensorMeta | None:
        return None if m is None else replace(m, device=device)

    def value(v: Value | None) -> Value | None:
        return None if v is None else replace(v, meta=meta(v.meta))

    def kwarg(arg: Any) -> Any:
        return Sym("device", device) if isinstance(arg, Sym) and arg.kind == "device" else arg

    def line(x: Any) -> Any:
        if hasattr(x, "outputs") and not isinstance(x, FusedKernel):
            kwargs = tuple((k, kwarg(a)) for k, a in x.kwargs) if hasattr(x, "kwargs") else None
            x = replace(x, kwargs=kwargs) if kwargs is not None else x
            return replace(x, outputs=tuple(value(v) for v in x.outputs))
        if isinstance(getattr(x, "value", None), Value):
            return replace(x, value=value(x.value))
        return x

    fused = tuple(
        replace(
            f,
            outputs=tuple(value(v) for v in f.outputs),
            lines=tuple(line(x) for x in f.lines),
            writes=tuple(value(v) for v in f.writes),
        )
        for f in program.fused
    )
    return replace(
        program,
        inputs=tuple(replace(i, meta=meta(i.meta)) for i in program.inputs),
        constants=tuple(replace(c, meta=meta(c.meta)) for c in program.constants),
        setup=tuple(line(x) for x in program.setup),
        body=tuple(line(x) for x in program.body),
        fused=fused,
    )
