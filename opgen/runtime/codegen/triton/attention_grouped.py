"""The Triton source of a grouped decode-attention kernel: an `AttentionPlan` with `grouped`, where one
program takes every query row of one key/value head (`group` of them) instead of one row.

A grouped-query model has several query heads per key/value head (4 in Llama-3.2-1B, 7 in Qwen2.5-0.5B,
8 in Gemma-2B). One program per query row reads its key/value head's cache once per row: `group` times
the bytes, with as many programs walking the same keys. Here a program loads the group's query rows
as one tile (rows past the group masked, up to BLOCK_H, at least 16: the smallest dot), and per block
of keys computes the group's scores and its weighted values as two `tl.dot`s (tensor cores; float32
at full precision, as ATen's attention). The probabilities enter the second dot in the values' dtype,
as flash attention's do. The keys are read once, so a batch has `group` times fewer programs, which
leaves room for more splits of the cache (`passes.fusion.attention.splits_for`).

The rest is the one-row kernel's (`codegen.triton.attention`): the kept range found on the device (the
mask is one row for the whole group: its head dimension broadcasts), pieces of whole blocks among up
to `splits` programs, partial rows, a ticket from the group's counter, and the last program's combine,
here of every row of the group at once.
"""

from __future__ import annotations

from opgen.runtime.codegen.triton import attention_prologue
from opgen.runtime.codegen.triton.attention import (
    first_loads,
    head_lanes,
    head_masks,
    head_width,
    mask_kind,
    masking,
    params,
    scale_of,
    softcapping,
    walk,
)
from opgen.runtime.codegen.triton.module import ieee_dot, jit_module, next_power_of_2
from opgen.runtime.ir import AttentionPlan

_LOOP = """\
        for block in range(0, {blocks}):
            start = first + block * BLOCK_S
            if start < last:
                s = start + tl.arange(0, BLOCK_S)
                s_ok = s < last
{mask}\
                keys = tl.load(k + {k_base} + s[None, :] * {k_s} + d[:, None] * {k_d}, mask=s_ok[None, :]{d_rows},
                               other=0.0)
                vals = tl.load(v + {v_base} + s[:, None] * {v_s} + d[None, :] * {v_d}, mask=s_ok[:, None]{d_cols},
                               other=0.0)  # with the keys: one round trip for the block
{score_dot}
                scores = scores * {scale!r}
{softcap}{apply}\
                scores = tl.where(s_ok[None, :], scores, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(scores, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(scores - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                p = p.to(vals.dtype)
{value_dot}
                acc = acc * alpha[:, None] + weighted
                m_i = m_new
"""

# Where one program's piece is not the whole range: the group's partial rows, a ticket, the last one's combine.
_COMBINE = """\
        if parts == 1:
            {store}
        else:
            mine = part + ((b * {heads} + hs) * {splits} + split) * {width}
            tl.store(mine[:, None] + d[None, :], acc, mask=h_ok[:, None]{d_cols})
            tl.store(mine + {dim}, m_i, mask=h_ok)
            tl.store(mine + {dim} + 1, l_i, mask=h_ok)
            tl.debug_barrier()  # every thread's stores before the ticket (which releases them)
            ticket = tl.atomic_add(count + pid, 1, sem="acq_rel")
            if ticket == parts - 1:  # the group's last program: the others' partials are all written
                tl.atomic_xchg(count + pid, 0)  # zero again for the next launch
                j = tl.arange(0, {splits})
                held = h_ok[:, None] & (j < parts)[None, :]
                theirs = part + ((b * {heads} + hs[:, None]) * {splits} + j[None, :]) * {width}
                maxima = tl.load(theirs + {dim}, mask=held, other=-1e30, cache_modifier=".cg")
                sums = tl.load(theirs + {dim} + 1, mask=held, other=0.0, cache_modifier=".cg")
                rows = tl.load(theirs[:, :, None] + d[None, None, :], mask=held[:, :, None]{d_deep}, other=0.0,
                               cache_modifier=".cg")
                weight = tl.exp(maxima - tl.max(maxima, 1)[:, None])
                total = tl.where(h_ok, tl.sum(sums * weight, 1), 1.0)  # rows past the group: not stored
                combined = tl.sum(rows * weight[:, :, None], 1) / total[:, None]
                tl.store(out + {out_rows}, combined.to(out.dtype.element_ty), mask=h_ok[:, None]{d_cols})
"""


def block_h(plan: AttentionPlan) -> int:
    """The rows of a group's tile: the group rounded up to a power of two, at least 16 (the smallest dot)."""
    return max(16, next_power_of_2(plan.group))


def kernel(plan: AttentionPlan) -> tuple[str, str]:
    """(name, source): parameters q, k, v, (mask,) (nk, nv, at0.., ) (part, count,) out, then BLOCK_S."""
    q, key, value, out = plan.query, plan.key, plan.value, plan.out
    batch, heads, _, dim = q.shape
    kv_heads, length = int(key.shape[1]), int(key.shape[2])  # type: ignore[arg-type]
    split = plan.splits > 1
    masks = masking(plan, "[None, :]")
    out_rows = f"b * {out.stride[0]} + hs[:, None] * {out.stride[1]} + d[None, :] * {out.stride[3]}"
    (d_cols, _), (d_rows, _), (d_deep, _) = (head_masks(plan, lanes) for lanes in ("[None, :]", "[:, None]",
                                                                                   "[None, None, :]"))  # fmt: skip
    d_and, d_row = head_masks(plan, "")  # the step's key and value rows: one head's lanes
    store = f"tl.store(out + {out_rows}, (acc / l_i[:, None]).to(out.dtype.element_ty), mask=h_ok[:, None]{d_cols})"
    query_load = (f"tl.load(q + b * {q.stride[0]} + hs[:, None] * {q.stride[1]} + d[None, :] * {q.stride[3]}, "
                  f"mask=h_ok[:, None]{d_cols}, other=0.0)")  # fmt: skip
    body = [
        f"    # a group of query rows over {length} keys: {batch} x {kv_heads} key/value heads, {plan.group} per "
        f"key/value head, heads of {dim}, {mask_kind(plan)}; up to {plan.splits} program(s) a group",
        "    pid = tl.program_id(0)",
        *(["    split = tl.program_id(1)"] if split else []),
        f"    b = pid // {kv_heads}",
        f"    g = pid % {kv_heads}",
        f"    h = g * {plan.group}  # the group's first head (the mask's row: its head dimension broadcasts)",
        f"    hs = h + tl.arange(0, {block_h(plan)})",
        f"    h_ok = hs < h + {plan.group}",
        *head_lanes(plan),
        # the loads that need nothing first (the query rows, the mask's row, the step's rows): one round trip
        f"    qs = {attention_prologue.query(plan, 'hs[:, None]', f'h_ok[:, None]{d_cols}') or query_load}",
        *first_loads(plan, masks, d_row, d_and),
    ]
    rows = block_h(plan)
    inner = [
        f"        m_i = tl.full(({rows},), -1e30, tl.float32)  # finite: a block all masked adds nothing",
        f"        l_i = tl.zeros(({rows},), tl.float32)",
        f"        acc = tl.zeros(({rows}, {head_width(plan)[1]}), dtype=tl.float32)",
        _LOOP.format(
            blocks=f"({-(-length // plan.splits)} + BLOCK_S - 1) // BLOCK_S", mask=masks.block,
            apply=masks.apply, softcap=softcapping(plan), d_cols=d_cols, d_rows=d_rows,
            k_base=f"b * {key.stride[0]} + g * {key.stride[1]}", k_s=key.stride[2], k_d=key.stride[3],
            v_base=f"b * {value.stride[0]} + g * {value.stride[1]}", v_s=value.stride[2], v_d=value.stride[3],
            scale=scale_of(plan), score_dot=ieee_dot("scores", "qs", "keys", "qs.dtype", 16),
            value_dot=ieee_dot("weighted", "p", "vals", "p.dtype", 16),
        ).rstrip("\n"),
    ]  # fmt: skip
    combine = _COMBINE.format(store=store, out_rows=out_rows, heads=heads, splits=plan.splits,  # type: ignore[call-overload]
                              width=int(dim) + 2, dim=dim, d_cols=d_cols, d_deep=d_deep)  # fmt: skip
    body += walk(plan, inner, combine, store)
    return jit_module("attention_grouped", params(plan), "BLOCK_S: tl.constexpr", "\n".join(body),
                      attention_prologue.helpers(plan))  # fmt: skip
