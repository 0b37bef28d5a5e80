"""The lines by which a decode-attention kernel stores the step's key and value rows into its cache
before reading it (an `AttentionPlan` with `step_rows`: `passes.fusion.attention_writes`).

Every program stores the rows of its key/value head (`g`) of its batch row (`b`) at the step's
position: the programs that share a head store the same values, and each one's own reads, after the
barrier, see them. The position is the sum of the plan's terms, wrapped where negative as ATen wraps
an index; one out of the cache's range stores nothing (eager stops with a device-side assertion).
"""

from __future__ import annotations

from opgen.runtime.codegen.triton import attention_prologue
from opgen.runtime.ir import AttentionPlan, TensorMeta


def params(plan: AttentionPlan) -> list[str]:
    """The kernel's parameters for the rows, after the mask's: the key rows (unless the kernel computes
    them: `attention_prologue`), the value rows, the terms."""
    rows = plan.step_rows
    if rows is None:
        return []
    return [*([] if rows.key_part else ["nk"]), "nv", *(f"at{i}" for i in range(rows.terms))]


def lines(plan: AttentionPlan, lanes: str = "") -> list[str]:
    """The kernel body's lines that store the rows (`b`, `g` and `d`, the head dimension, defined before);
    `lanes` masks the loads and stores to the head where it is padded (`attention.head_masks`: `, mask=d_ok`)."""
    rows = plan.step_rows
    if rows is None:
        return []
    length = int(plan.key.shape[2])  # type: ignore[arg-type]
    (kb, kg, kd), (vb, vg, vd) = rows.key_stride, rows.value_stride
    position = " + ".join(f"tl.load(at{i})" for i in range(rows.terms))
    return [
        "    # this step's key and value rows into the cache at its position, before anything reads it",
        f"    at = {position}",
        f"    at = tl.where(at < 0, at + {length}, at)",
        f"    if (at >= 0) & (at < {length}):",
        f"        kr = {attention_prologue.key(plan) or f'tl.load(nk + b * {kb} + g * {kg} + d * {kd}{lanes})'}",
        f"        vr = tl.load(nv + b * {vb} + g * {vg} + d * {vd}{lanes})",
        f"        tl.store(k + {_slot(plan.key)}, kr{lanes})",
        f"        tl.store(v + {_slot(plan.value)}, vr{lanes})",
        "    tl.debug_barrier()  # every thread's stores before any thread of the program reads the cache",
    ]


def _slot(meta: TensorMeta) -> str:
    """The offset of the row at position `at` of head `g` of batch row `b`, elements `d`."""
    return f"b * {meta.stride[0]} + g * {meta.stride[1]} + at * {meta.stride[2]} + d * {meta.stride[3]}"
