"""The Triton source of a decode-attention kernel (an `AttentionPlan` of `opgen.runtime.passes.fusion.attention`).

A row is one (batch, query head): one query row against the keys. Query head `h` reads key/value head
`h // group` of the cache, where the cache is. Sizes, strides and the scale are literals; names are
not (see `kernel`), so a model's layers share one kernel.

**The kept positions, found on the device.** A static cache is mostly positions not yet written, which
the mask hides. Each program first loads its row's whole mask and takes the range it keeps, from the
first kept position to the last (a boolean mask true, an additive one above `MASKED_OUT`); no key or
value outside it is read. Without a mask the range is the whole cache.

**Split over up to `plan.splits` programs (flash-decoding).** The range is cut into as many pieces of
whole blocks (BLOCK_S keys) as it takes, at most `splits`: one early in a generation, more as the
cache fills. Each program walks its piece with an online softmax in float32 (running maximum and
sum, as flash attention does). Where one program holds the whole range it writes the output row
itself. Otherwise each writes its partial row, maximum and sum to the `part` buffer and takes a
ticket from the row's counter; the last to arrive combines the partials, writes the output row and
resets the counter to zero for the next launch. One launch, whatever the fill: a row's serial chain
of blocks stays short as the cache grows, where a single program per row would walk it all.

The split is decided in the kernel from the mask, so it fits every position of the cache, not only
the one the first call is timed at; the first call's timing picks only BLOCK_S and the warps.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from opgen.runtime.codegen.triton import attention_prologue, attention_writes
from opgen.runtime.codegen.triton.module import jit_module, next_power_of_2
from opgen.runtime.ir import AttentionPlan, Config, TensorMeta

# (keys per block, warps): the first call's autotuning keeps the fastest. A piece is whole blocks, so
# smaller blocks also split a short range finer.
BLOCKS = ((32, 4), (64, 4), (128, 4), (128, 8))
# An additive mask at most this keeps nothing: with the running maximum at least -1e30 (where it starts),
# exp(score + mask - max) is exactly 0 (transformers fills with the dtype's minimum, -3.4e38 for bfloat16
# and float32).
MASKED_OUT = -1e36
MAX_SPAN = 16384  # a longer mask is not scanned for its kept range (its programs split the whole cache)

_MASK_ROW = """\
    every = tl.arange(0, {span})
    row_mask = tl.load(mask + {row} + every * {m_s}, mask=every < {length}, other={other})
"""
_RANGE = """\
    keep = {kept}
    lo = tl.min(tl.where(keep, every, {length}), 0)
    hi = tl.max(tl.where(keep, every + 1, 0), 0)
"""

# The piece's blocks: a literal count, the most any piece can hold; blocks past the piece's end do nothing.
_LOOP = """\
        for block in range(0, {blocks}):
            start = first + block * BLOCK_S
            if start < last:
                s = start + tl.arange(0, BLOCK_S)
                s_ok = s < last
{mask}\
                keys = tl.load(k + {k_base} + s[:, None] * {k_s} + d[None, :] * {k_d}, mask=s_ok[:, None]{d_cols},
                               other=0.0)
                vals = tl.load(v + {v_base} + s[:, None] * {v_s} + d[None, :] * {v_d}, mask=s_ok[:, None]{d_cols},
                               other=0.0)  # with the keys: one round trip for the block
                scores = tl.sum(keys.to(tl.float32) * qv[None, :], 1)
{softcap}{apply}\
                scores = tl.where(s_ok, scores, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(scores, 0))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(scores - m_new)
                l_i = l_i * alpha + tl.sum(p, 0)
                acc = acc * alpha + tl.sum(p[:, None] * vals.to(tl.float32), 0)
                m_i = m_new
"""

# Where one program's piece is not the whole range: its partial results, a ticket, and the last one's combine.
_COMBINE = """\
        if parts == 1:
            tl.store(out + {out_row}, (acc / l_i).to(out.dtype.element_ty){d_store})
        else:
            mine = part + (pid * {splits} + split) * {width}
            tl.store(mine + d, acc{d_store})
            tl.store(mine + {dim}, m_i)
            tl.store(mine + {dim} + 1, l_i)
            tl.debug_barrier()  # every thread's stores before the ticket (which releases them)
            ticket = tl.atomic_add(count + pid, 1, sem="acq_rel")
            if ticket == parts - 1:  # the row's last program: the others' partials are all written
                tl.atomic_xchg(count + pid, 0)  # zero again for the next launch
                j = tl.arange(0, {splits})
                held = j < parts
                theirs = part + (pid * {splits} + j) * {width}
                maxima = tl.load(theirs + {dim}, mask=held, other=float("-inf"), cache_modifier=".cg")
                sums = tl.load(theirs + {dim} + 1, mask=held, other=0.0, cache_modifier=".cg")
                rows = tl.load(theirs[:, None] + d[None, :], mask=held[:, None]{d_cols}, other=0.0,
                               cache_modifier=".cg")
                weight = tl.exp(maxima - tl.max(maxima, 0))
                total = tl.sum(sums * weight, 0)
                tl.store(out + {out_row}, (tl.sum(rows * weight[:, None], 0) / total).to(out.dtype.element_ty){d_store})
"""


def _stride(meta: TensorMeta, dim: int) -> int:
    """The stride to step along `dim`: 0 where the tensor broadcasts there (size 1)."""
    return 0 if meta.shape[dim] == 1 else int(meta.stride[dim])  # type: ignore[arg-type]  # static


def _span(length: int) -> int:
    return max(16, next_power_of_2(length))  # the smallest power of two >= S (at least 16)


class Masking(NamedTuple):
    """The mask's lines: `row` loads the row `b`, `h` whole (issued with the kernel's other first loads),
    `kept_range` finds in it the range from `lo` to `hi` that the mask keeps (the whole cache without a mask),
    `block` loads a block's part of the row and `apply` puts it on the block's scores."""

    row: str
    kept_range: str
    block: str
    apply: str


def masking(plan: AttentionPlan, scores: str = "") -> Masking:
    """The mask's lines (`Masking`); `scores` indexes the mask's row of a block (`[None, :]`: every row of a
    group's scores takes it)."""
    m, length = plan.mask, int(plan.key.shape[2])  # type: ignore[arg-type]
    whole = f"    lo = pid * 0  # the whole cache, as scalars of the program\n    hi = lo + {length}\n"
    if m is None or length > MAX_SPAN:  # a longer mask is not scanned: its programs split the whole cache
        row = ""
        kept_range = whole
    else:
        row = _MASK_ROW.format(span=_span(length), row=_mask_row(m), m_s=_stride(m, 3), length=length,
                               other=_masked_value(m))  # fmt: skip
        kept = "row_mask != 0" if m.dtype == "bool" else f"row_mask.to(tl.float32) > {MASKED_OUT}"
        kept_range = _RANGE.format(length=length, kept=kept)
    if m is None:
        return Masking(row, kept_range, "", "")
    row_at = f"mask + {_mask_row(m)} + s * {_stride(m, 3)}"
    block = f"                masked = tl.load({row_at}, mask=s_ok, other={_masked_value(m)})\n"
    apply = (f'                scores = tl.where(masked{scores} != 0, scores, float("-inf"))\n' if m.dtype == "bool"
             else f"                scores += masked{scores}.to(tl.float32)\n")  # fmt: skip
    return Masking(row, kept_range, block, apply)


def _mask_row(m: TensorMeta) -> str:
    return f"b * {_stride(m, 0)} + h * {_stride(m, 1)}"


def _masked_value(m: TensorMeta) -> str:
    """What a load past the mask's end reads: masked out."""
    return "0" if m.dtype == "bool" else "float('-inf')"


def softcapping(plan: AttentionPlan) -> str:
    """The cap on a block's scaled scores, `cap * tanh(s / cap)` in float32 (Gemma-2), before the mask; "" without."""
    if plan.softcap is None:
        return ""
    cap = float(plan.softcap)
    tanh = f"(2.0 * tl.sigmoid(scores * {2.0 / cap!r}) - 1.0)"  # tanh(s / cap)
    return f"                scores = {cap!r} * {tanh}\n"


def head_width(plan: AttentionPlan) -> tuple[int, int]:
    """(the head size D, the power of two `d` spans): a D that is no power of two (Phi-3's 96) is padded, its
    lanes past D masked (`d_ok`) in every load and store and zero in every product."""
    dim = int(plan.query.shape[3])  # type: ignore[arg-type]
    return dim, next_power_of_2(dim)


def head_lanes(plan: AttentionPlan) -> list[str]:
    """The lines that define `d` (and `d_ok` where the head is padded)."""
    dim, span = head_width(plan)
    return [f"    d = tl.arange(0, {span})", *([f"    d_ok = d < {dim}"] if span != dim else [])]


def head_masks(plan: AttentionPlan, lanes: str) -> tuple[str, str]:
    """(`& d_ok<lanes>` for a load's or store's mask, `, mask=d_ok<lanes>` for a store without one); both ""
    where the head needs no padding. `lanes` indexes d_ok as the tile's head dimension (`[None, :]`)."""
    dim, span = head_width(plan)
    if span == dim:
        return "", ""
    return f" & d_ok{lanes}", f", mask=d_ok{lanes}"


def scale_of(plan: AttentionPlan) -> float:
    """The scores' scale: the plan's, or 1 / sqrt(head size)."""
    return plan.scale if plan.scale is not None else 1.0 / math.sqrt(plan.query.shape[3])  # type: ignore[arg-type]


def mask_kind(plan: AttentionPlan) -> str:
    m = plan.mask
    return "no mask" if m is None else ("a boolean mask" if m.dtype == "bool" else "an additive mask")


def kernel(plan: AttentionPlan) -> tuple[str, str]:
    """(name, source): parameters q, k, v, (mask,) (nk, nv, at0.., ) (part, count,) out, then BLOCK_S."""
    q, key, value, out = plan.query, plan.key, plan.value, plan.out
    batch, heads, _, dim = q.shape
    length = int(key.shape[2])  # type: ignore[arg-type]
    scale = scale_of(plan)
    split = plan.splits > 1
    masks = masking(plan)
    out_row = f"b * {out.stride[0]} + h * {out.stride[1]} + d * {out.stride[3]}"
    d_cols, _ = head_masks(plan, "[None, :]")
    d_and, d_row = head_masks(plan, "")
    masked = f"{d_row}, other=0.0" if d_row else ""
    query_load = f"tl.load(q + b * {q.stride[0]} + h * {q.stride[1]} + d * {q.stride[3]}{masked})"
    query = attention_prologue.query(plan, "h", None)
    if query is not None and d_row:
        query = f"tl.where(d_ok, {query}, 0.0)"
    body = [
        f"    # one query row over {length} keys: {batch} x {heads} heads of {dim}, "
        f"{plan.group} per key/value head, {mask_kind(plan)}; up to {plan.splits} program(s) a row",
        "    pid = tl.program_id(0)",
        *(["    split = tl.program_id(1)"] if split else []),
        f"    b = pid // {heads}",
        f"    h = pid % {heads}",
        f"    g = h // {plan.group}",
        *head_lanes(plan),
        # the loads that need nothing first (the query row, the mask's row, the step's rows): one round trip
        f"    qv = ({query or query_load}).to(tl.float32) * {scale!r}",
        *first_loads(plan, masks, d_row, d_and),
    ]
    inner = [
        "        m_i = tl.max(tl.full((BLOCK_S,), -1e30, tl.float32), 0)  # finite: a block all masked adds nothing",
        "        l_i = tl.sum(tl.zeros((BLOCK_S,), tl.float32), 0)",
        f"        acc = tl.zeros(({head_width(plan)[1]},), dtype=tl.float32)",
        _LOOP.format(
            blocks=f"({-(-length // plan.splits)} + BLOCK_S - 1) // BLOCK_S", mask=masks.block,
            apply=masks.apply, softcap=softcapping(plan), d_cols=d_cols,
            k_base=f"b * {key.stride[0]} + g * {key.stride[1]}", k_s=key.stride[2], k_d=key.stride[3],
            v_base=f"b * {value.stride[0]} + g * {value.stride[1]}", v_s=value.stride[2], v_d=value.stride[3],
        ).rstrip("\n"),
    ]  # fmt: skip
    combine = _COMBINE.format(out_row=out_row, splits=plan.splits, width=int(dim) + 2, dim=dim,  # type: ignore[call-overload]
                              d_cols=d_cols, d_store=d_row)  # fmt: skip
    body += walk(plan, inner, combine, f"tl.store(out + {out_row}, (acc / l_i).to(out.dtype.element_ty){d_row})")
    helpers = attention_prologue.helpers(plan)
    return jit_module("attention", params(plan), "BLOCK_S: tl.constexpr", "\n".join(body), helpers)


def first_loads(plan: AttentionPlan, masks: Masking, d_row: str, d_and: str) -> list[str]:
    """The body's lines after the query's: the mask's row and the step's rows loaded (none waits for
    another), the rows stored, then the kept range found in the mask's row. `d_row` and `d_and` mask the
    rows' loads and stores to the head where it is padded (`head_masks`)."""
    return [
        *([masks.row.rstrip("\n")] if masks.row else []),
        *attention_writes.loads(plan, d_row),
        *attention_writes.stores(plan, d_and),
        masks.kept_range.rstrip("\n"),
    ]


def walk(plan: AttentionPlan, inner: list[str], combine: str, store: str) -> list[str]:
    """The body's walk over the kept range: with splits, this program's piece (`inner`, then `combine`);
    without, the whole range, then `store`. `inner` and `combine` are indented for the split's `if`."""
    if plan.splits > 1:
        return [
            "    # the kept range in pieces of whole blocks, one a program (at least one: all masked gives 0 / 0)",
            f"    per = tl.maximum(tl.cdiv(tl.cdiv(hi - lo, {plan.splits}), BLOCK_S), 1) * BLOCK_S",
            "    parts = tl.maximum(tl.cdiv(hi - lo, per), 1)",
            "    if split < parts:",
            "        first = lo + split * per",
            "        last = tl.minimum(first + per, hi)",
            *inner,
            combine.rstrip("\n"),
        ]
    whole = ["        first = lo", "        last = hi", *inner, f"        {store}"]  # one program, the whole range
    return [line[4:] for line in "\n".join(whole).split("\n")]


def params(plan: AttentionPlan) -> list[str]:
    split = ["part", "count"] if plan.splits > 1 else []
    mask = ["mask"] if plan.mask is not None else []
    query = [] if plan.query_part else ["q"]
    shared = attention_prologue.shared_params(plan)
    return [*shared, *query, "k", "v", *mask, *attention_writes.params(plan), *split, "out"]


def configs(plan: AttentionPlan) -> tuple[Config, ...]:
    longest = _span(int(plan.key.shape[2]))  # type: ignore[arg-type]
    grid = (plan.programs, plan.splits) if plan.splits > 1 else (plan.programs,)
    found: list[Config] = []
    for block, warps in BLOCKS:
        config: Config = ((("BLOCK_S", min(block, longest)),), warps, 1, grid)
        if config not in found:
            found.append(config)
    return tuple(found)
