"""Means over H and W of channels-last tensors, each as one generated Triton kernel.

A squeeze-excitation block (EfficientNet, MobileNetV3) averages each channel over the image. In the
cudnn pass's channels-last region that is a reduction over the middle dimensions of an (N, H, W, C)
layout, which ATen's reduction kernel runs far slower than over NCHW's last ones: on the H100
EfficientNet-B0's 17 means took 147 us channels-last against 62 us on NCHW values. Here each such mean
becomes a kernel that reads the channels-last tensor in place (`codegen.triton.spatial_mean` prints
its `SpatialMeanPlan`: adjacent channels of one image per program, summed in float32).

Each kernel is a `FusedKernel`, bound like the fusion pass's: a multi-kernel choice against the
`mean` call it replaced, timed on the first call. CUDA, static sizes, float32/float16/bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterator

from opgen.runtime.ir import FusedKernel, KernelCall, Line, Program, Ref, SpatialMeanPlan, TensorMeta, meta_table
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.passes.layout import channels_last_strides
from opgen.runtime.passes.region_ops import MEAN, spatial_mean
from opgen.runtime.registry import KernelRegistry

DTYPES = ("float32", "float16", "bfloat16")


def spatial_means(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    locals_ = fresh_namer(program, "mean")
    kernels = ((i, _kernel(line, metas, locals_)) for i, line in enumerate(program.body))
    return place(program, [(spec, (i,), i) for i, spec in kernels if spec is not None])


def _kernel(line: Line, metas: dict[str, TensorMeta], locals_: Iterator[str]) -> FusedKernel | None:
    source = _channels_last_mean(line, metas)
    if source is None:
        return None
    assert isinstance(line, KernelCall) and line.outputs[0] is not None and line.outputs[0].meta is not None
    x, out = metas[source], line.outputs[0].meta
    n, c, h, w = (d if isinstance(d, int) else 0 for d in x.shape)  # static: checked
    return FusedKernel.make(
        next(locals_),
        SpatialMeanPlan(x, out),
        inputs=((source, x.dtype),),
        outputs=(line.outputs[0],),
        nodes=(line.node,),
        describe=f"channels-last mean over {h}x{w} of {n}x{c}",
        lines=(line,),
    )


def _channels_last_mean(line: Line, metas: dict[str, TensorMeta]) -> str | None:
    """The name of the input of a keepdim mean over H and W of a static channels-last CUDA tensor."""
    if not isinstance(line, KernelCall) or line.target != MEAN or line.fallback or len(line.outputs) != 1:
        return None
    out = line.outputs[0]
    source = line.args[0] if line.args else None
    x = metas.get(source.name) if isinstance(source, Ref) else None
    if out is None or out.meta is None or x is None or not (x.is_static and out.meta.is_static):
        return None
    if len(x.shape) != 4 or not x.device.startswith("cuda") or x.dtype not in DTYPES or out.meta.dtype != x.dtype:
        return None
    if not spatial_mean(line):
        return None
    _, c, h, w = x.shape
    if c == 1 or h * w == 1 or x.stride != channels_last_strides(x.shape) or x.offset != 0:  # type: ignore[operator]
        return None
    return source.name if isinstance(source, Ref) else None
