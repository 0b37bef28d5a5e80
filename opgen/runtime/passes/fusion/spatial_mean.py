"""Means over H and W of channels-last tensors, each as one generated Triton kernel.

A squeeze-excitation block (EfficientNet, MobileNetV3) averages each channel over the image. In the
cudnn pass's channels-last region that is a reduction over the middle dimensions of an (N, H, W, C)
layout, which ATen's reduction kernel runs far slower than over NCHW's last ones: on the H100
EfficientNet-B0's 17 means took 147 us channels-last against 62 us on NCHW values. Here one program
takes a block of adjacent channels of one image and walks the H*W positions in tiles of BLOCK_R rows,
each row of BLOCK_C channels one contiguous load, summing in float32; the mean is the sum over H*W,
rounded to the result's dtype as ATen's is.

Each kernel is a `FusedKernel`, bound like the fusion pass's: a multi-kernel choice against the
`mean` call it replaced, timed on the first call. CUDA, static sizes, float32/float16/bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterator

from opgen.runtime.ir import FusedKernel, KernelCall, Line, Program, Ref, TensorMeta, meta_table
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.passes.fusion.ops import TL
from opgen.runtime.passes.fusion.source import jit_module
from opgen.runtime.passes.layout import channels_last_strides
from opgen.runtime.passes.region_ops import MEAN, spatial_mean
from opgen.runtime.registry import KernelRegistry

DTYPES = ("float32", "float16", "bfloat16")
TILES = ((8, 256, 4), (32, 64, 4), (64, 64, 4), (128, 32, 8))  # (BLOCK_C, BLOCK_R, warps)


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
    name, text = jit_module("mean", ["in0", "out0"], "BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr",
                            _body(c, h * w, out, x.dtype))  # fmt: skip
    configs = tuple(
        ((("BLOCK_C", bc), ("BLOCK_R", br)), warps, 1, (n, -(-c // bc), 1))
        for bc, br, warps in TILES
        if bc <= max(8, 1 << (c - 1).bit_length())
    )
    return FusedKernel(
        local=next(locals_),
        name=name,
        source=text,
        inputs=(source,),
        input_dtypes=(x.dtype,),
        outputs=(line.outputs[0],),
        configs=configs,
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


def _body(c: int, hw: int, out: TensorMeta, dtype: str) -> str:
    sn, sc = out.stride[0], out.stride[1]
    result = "total" if dtype == "float32" else f"total.to({TL[dtype]})"
    lines = [
        f"# mean over {hw} positions of {c} channels-last channels",
        "n = tl.program_id(0)",
        "cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
        f"cmask = cs < {c}",
        "acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)",
        f"for start in range(0, {hw}, BLOCK_R):",
        "    rs = start + tl.arange(0, BLOCK_R)",
        f"    mask = (rs < {hw})[:, None] & cmask[None, :]",
        f"    x = tl.load(in0 + n * {hw * c} + rs[:, None] * {c} + cs[None, :], mask=mask, other=0.0)",
        "    acc += x.to(tl.float32)",
        f"total = tl.sum(acc, axis=0) / {hw}",
        f"tl.store(out0 + n * {sn} + cs * {sc}, {result}, mask=cmask)",
    ]
    return "\n".join(f"    {line}" for line in lines)
