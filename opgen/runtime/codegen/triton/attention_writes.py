"""The lines by which a decode-attention kernel stores the step's key and value rows into its cache
before reading it (an `AttentionPlan` with `step_rows`: `passes.fusion.attention_writes`).

Every program stores the rows of its key/value head (`g`) of its batch row (`b`) at the step's
position: the programs that share a head store the same values, and each one's own reads, after the
barrier, see them. The position is the sum of the plan's terms, wrapped where negative as ATen wraps
an index; one out of the cache's range stores nothing (eager stops with a device-side assertion).

The rows and the position are loaded apart from the stores (`loads`, `stores`): the rows' addresses do
not depend on the position, so the kernel issues them with its query and mask, one round trip to memory
for all, rather than one for the position and another for the rows it guards.
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


def loads(plan: AttentionPlan, lanes: str = "") -> list[str]:
    """The kernel body's lines that load (or compute) the rows and their position (`b`, `g` and `d`, the head
    dimension, defined before). None of them waits for another, so they are issued with the kernel's other
    first loads; `lanes` masks the loads to the head where it is padded (`attention.head_masks`: `, mask=d_ok`)."""
    rows = plan.step_rows
    if rows is None:
        return []
    length = int(plan.key.shape[2])  # type: ignore[arg-type]
    (kb, kg, kd), (vb, vg, vd) = rows.key_stride, rows.value_stride
    position = " + ".join(f"tl.load(at{i})" for i in range(rows.terms))
    return [
        "    # this step's key and value rows, and their position in the cache",
        f"    at = {position}",
        f"    kr = {attention_prologue.key(plan) or f'tl.load(nk + b * {kb} + g * {kg} + d * {kd}{lanes})'}",
        f"    vr = tl.load(nv + b * {vb} + g * {vg} + d * {vd}{lanes})",
        f"    at = tl.where(at < 0, at + {length}, at)",
    ]


def stores(plan: AttentionPlan, lanes: str = "") -> list[str]:
    """The lines that store the rows `loads` read into the cache, then wait for every thread of the program
    (before any of them reads the cache). `lanes` is `& d_ok` where the head is padded, else ""."""
    if plan.step_rows is None:
        return []
    length = int(plan.key.shape[2])  # type: ignore[arg-type]
    return [
        f"    fits = (at >= 0) & (at < {length})  # a position out of the cache's range stores nothing",
        f"    tl.store(k + {_slot(plan.key)}, kr, mask=fits{lanes})",
        f"    tl.store(v + {_slot(plan.value)}, vr, mask=fits{lanes})",
        "    tl.debug_barrier()  # every thread's stores before any thread of the program reads the cache",
    ]


def _slot(meta: TensorMeta) -> str:
    """The offset of the row at position `at` of head `g` of batch row `b`, elements `d`."""
    return f"b * {meta.stride[0]} + g * {meta.stride[1]} + at * {meta.stride[2]} + d * {meta.stride[3]}"
