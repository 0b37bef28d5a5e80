"""The Triton source of a decode-attention kernel (an `AttentionPlan` of `opgen.runtime.passes.fusion.attention`).

One program per (batch, query head): it loads the query row, walks the keys in blocks of BLOCK_S
with an online softmax in float32 (running maximum and sum, as flash attention does), and
accumulates the value rows. Query head `h` reads key/value head `h // group` of the cache, where
the cache is. Sizes, strides and the scale are literals; names are not (see `kernel`), so a
model's layers share one kernel.

With a mask, a static cache is mostly positions not yet written, masked out: configs with SKIP read
each block's mask first and load none of its keys and values where it keeps no position (a boolean
mask all false, an additive one at most `MASKED_OUT` everywhere: such a block adds exactly nothing to
the running sums, whose maximum starts at -1e30). That costs a wait for the mask before the keys'
loads, so the configs without it stay, and the first call's timing picks.
"""

from __future__ import annotations

import math

from opgen.runtime.codegen.triton.module import jit_module
from opgen.runtime.ir import AttentionPlan, Config, TensorMeta

# (keys per step, warps): the first call's autotuning keeps the fastest. A short cache fits in one step:
# no loop-carried latency, more loads in flight.
BLOCKS = ((32, 4), (64, 4), (128, 4), (128, 8), (256, 8))
SKIPPING = ((64, 4), (128, 4), (256, 8))  # (keys per step, warps) also timed with SKIP, where there is a mask
# An additive mask at most this keeps nothing: with the running maximum at least -1e30 (where it starts),
# exp(score + mask - max) is exactly 0, as is what such a block adds (transformers fills with the dtype's
# minimum, -3.4e38 for bfloat16 and float32).
MASKED_OUT = -1e36

_LOOP = """\
    for start in range(0, {length}, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        s_ok = s < {length}
{mask}\
        if live:
            keys = tl.load(k + {k_base} + s[:, None] * {k_s} + d[None, :] * {k_d}, mask=s_ok[:, None], other=0.0)
            scores = tl.sum(keys.to(tl.float32) * qv[None, :], 1)
{apply}\
            scores = tl.where(s_ok, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new)
            l_i = l_i * alpha + tl.sum(p, 0)
            vals = tl.load(v + {v_base} + s[:, None] * {v_s} + d[None, :] * {v_d}, mask=s_ok[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * vals.to(tl.float32), 0)
            m_i = m_new
"""

# Where the block has a mask: load it, and with SKIP decide whether any of its positions is kept (`live`).
_MASKED = """\
        masked = tl.load({at}, mask=s_ok, other={other})
        if SKIP:
            live = tl.max(({kept}).to(tl.int32), 0) > 0
        else:
            live = True
"""


def _stride(meta: TensorMeta, dim: int) -> int:
    """The stride to step along `dim`: 0 where the tensor broadcasts there (size 1)."""
    return 0 if meta.shape[dim] == 1 else int(meta.stride[dim])  # type: ignore[arg-type]  # static


def kernel(plan: AttentionPlan) -> tuple[str, str]:
    """(name, source): parameters q, k, v, (mask,) out, then BLOCK_S."""
    q, key, value, m, out = plan.query, plan.key, plan.value, plan.mask, plan.out
    batch, heads, _, dim = q.shape
    length = key.shape[2]
    scale = plan.scale if plan.scale is not None else 1.0 / math.sqrt(dim)  # type: ignore[arg-type]
    kind = "no mask" if m is None else ("a boolean mask" if m.dtype == "bool" else "an additive mask")
    mask_lines, apply = "        live = True\n", ""
    if m is not None:
        at = f"mask + b * {_stride(m, 0)} + h * {_stride(m, 1)} + s * {_stride(m, 3)}"
        if m.dtype == "bool":
            mask_lines = _MASKED.format(at=at, other=0, kept="masked != 0")
            apply = '            scores = tl.where(masked != 0, scores, float("-inf"))\n'
        else:
            mask_lines = _MASKED.format(at=at, other="float('-inf')", kept=f"masked.to(tl.float32) > {MASKED_OUT}")
            apply = "            scores += masked.to(tl.float32)\n"
    body = [
        f"    # one query row over {length} keys: {batch} x {heads} heads of {dim}, "
        f"{plan.group} per key/value head, {kind}",
        "    pid = tl.program_id(0)",
        f"    b = pid // {heads}",
        f"    h = pid % {heads}",
        f"    g = h // {plan.group}",
        f"    d = tl.arange(0, {dim})",
        f"    qv = tl.load(q + b * {q.stride[0]} + h * {q.stride[1]} + d * {q.stride[3]}).to(tl.float32) * {scale!r}",
        "    m_i = tl.max(tl.full((BLOCK_S,), -1e30, tl.float32), 0)  # finite: a block all masked adds nothing",
        "    l_i = tl.sum(tl.zeros((BLOCK_S,), tl.float32), 0)",
        f"    acc = tl.zeros(({dim},), dtype=tl.float32)",
        _LOOP.format(
            length=length, mask=mask_lines, apply=apply,
            k_base=f"b * {key.stride[0]} + g * {key.stride[1]}", k_s=key.stride[2], k_d=key.stride[3],
            v_base=f"b * {value.stride[0]} + g * {value.stride[1]}", v_s=value.stride[2], v_d=value.stride[3],
        ).rstrip("\n"),
        f"    tl.store(out + b * {out.stride[0]} + h * {out.stride[1]} + d * {out.stride[3]}, "
        "(acc / l_i).to(out.dtype.element_ty))",
    ]  # fmt: skip
    params = ["q", "k", "v", *(["mask"] if m is not None else []), "out"]
    meta = "BLOCK_S: tl.constexpr" + (", SKIP: tl.constexpr" if m is not None else "")
    return jit_module("attention", params, meta, "\n".join(body))


def configs(plan: AttentionPlan) -> tuple[Config, ...]:
    length = int(plan.key.shape[2])  # type: ignore[arg-type]
    longest = 1 << max(4, math.ceil(math.log2(length)))  # the smallest power of two >= S (at least 16)
    grid = (int(plan.query.shape[0]) * plan.heads,)  # type: ignore[arg-type]
    masked = plan.mask is not None
    found: list[Config] = []
    for block, warps, skip in [*((b, w, 0) for b, w in BLOCKS), *((b, w, 1) for b, w in SKIPPING if masked)]:
        meta = (("BLOCK_S", min(block, longest)),) + ((("SKIP", skip),) if masked else ())
        config: Config = (meta, warps, 1, grid)
        if config not in found:
            found.append(config)
    return tuple(found)
