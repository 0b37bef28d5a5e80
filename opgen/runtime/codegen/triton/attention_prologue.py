"""A decode-attention kernel's query and stored key rows computed where they would be loaded: an
`AttentionPlan` with `query_part` or `step_rows.key_part` (`passes.fusion.attention_prologue`).

A decoder layer rotates its query and its new key (rotary embedding) in a pointwise kernel right before
the attention. Here that pointwise code is the attention kernel's own: each program evaluates the query
group at its query rows' flat indices and the key group at its key/value head's row
(`group_parts.pointwise_value`: the group's kernel code at given indices, rounded to the output's dtype
as its kernel stores it), instead of loading what the pointwise kernel stored. The groups' inputs are
the kernel's first parameters (`pi0..`, each graph value once: the two rotations share their angles).
"""

from __future__ import annotations

from opgen.runtime.codegen.triton.group_parts import pointwise_value
from opgen.runtime.ir import AttentionPlan, Computed


def shared_params(plan: AttentionPlan) -> list[str]:
    """The computed values' inputs: the kernel's first parameters."""
    return [f"pi{j}" for j in range(plan.shared_inputs)]


def key_part(plan: AttentionPlan) -> Computed | None:
    return plan.step_rows.key_part if plan.step_rows is not None else None


def helpers(plan: AttentionPlan) -> str:
    """The groups' functions (`_query`, `_key`, with the functions of the row groups they read), for the
    kernel's module."""
    parts = [(plan.query_part, "_query"), (key_part(plan), "_key")]
    return "\n\n".join(
        pointwise_value(part.group, name, part.reads, [source.group for source in part.rows])
        for part, name in parts
        if part is not None
    )


def _call(name: str, part: Computed, offs: str, mask: str) -> str:
    """The group's function called at `offs`: its loaded inputs, its row groups' inputs, and the batch row `b`
    (a row group's rows are the attention's batch rows: `passes.fusion.attention_rows`)."""
    args = [f"pi{j}" for j in part.args if j >= 0]
    args += [f"pi{j}" for source in part.rows for j in source.args]
    return f"{name}({', '.join([*args, *(['b'] if part.rows else []), offs, mask])})"


def query(plan: AttentionPlan, rows: str, ok: str | None) -> str | None:
    """The query's value at head(s) `rows` of batch row `b`, elements `d` (a [BLOCK_H, D] tile where `ok`
    masks the rows), from its group; None where the kernel loads it."""
    part = plan.query_part
    if part is None:
        return None
    heads, dim = int(plan.query.shape[1]), int(plan.query.shape[3])  # type: ignore[arg-type]
    offs = f"b * {heads * dim} + {rows} * {dim} + {'d[None, :]' if ok else 'd'}"
    mask = f"{ok} & (d[None, :] < {dim})" if ok else f"d < {dim}"
    value = _call("_query", part, offs, mask)
    return f"tl.where({ok}, {value}, 0.0)" if ok else value


def key(plan: AttentionPlan) -> str | None:
    """The stored key row of head `g` of batch row `b`, elements `d`, from its group; None where loaded."""
    part = key_part(plan)
    if part is None:
        return None
    kv_heads, dim = int(plan.key.shape[1]), int(plan.key.shape[3])  # type: ignore[arg-type]
    return _call("_key", part, f"b * {kv_heads * dim} + g * {dim} + d", f"d < {dim}")
