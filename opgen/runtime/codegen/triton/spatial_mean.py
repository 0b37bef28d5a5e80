"""The Triton source of a channels-last mean (a `SpatialMeanPlan` of `opgen.runtime.passes.fusion.spatial_mean`).

One program takes a block of adjacent channels of one image and walks the H*W positions in tiles of
BLOCK_R rows, each row of BLOCK_C channels one contiguous load, summing in float32; the mean is the
sum over H*W, rounded to the result's dtype as ATen's is.
"""

from __future__ import annotations

from opgen.runtime.codegen.triton.module import jit_module
from opgen.runtime.codegen.triton.ops import TL
from opgen.runtime.ir import Config, SpatialMeanPlan, TensorMeta

TILES = ((8, 256, 4), (32, 64, 4), (64, 64, 4), (128, 32, 8))  # (BLOCK_C, BLOCK_R, warps)


def kernel(plan: SpatialMeanPlan) -> tuple[str, str]:
    """(name, source): parameters the input `in0` and the output `out0`, then BLOCK_C and BLOCK_R."""
    _, c, h, w = (d if isinstance(d, int) else 0 for d in plan.x.shape)  # static: checked
    meta = "BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr"
    return jit_module("mean", ["in0", "out0"], meta, _body(c, h * w, plan.out, plan.x.dtype))


def configs(plan: SpatialMeanPlan) -> tuple[Config, ...]:
    n, c, _, _ = (d if isinstance(d, int) else 0 for d in plan.x.shape)
    return tuple(
        ((("BLOCK_C", bc), ("BLOCK_R", br)), warps, 1, (n, -(-c // bc), 1))
        for bc, br, warps in TILES
        if bc <= max(8, 1 << (c - 1).bit_length())
    )


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
