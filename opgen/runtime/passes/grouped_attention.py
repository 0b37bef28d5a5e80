"""Grouped-query attention reads its key/value heads in place: `enable_gqa` instead of the repeat.

A grouped-query model copies each key/value head for its group of query heads before attention
(`opgen.runtime.passes.repeat_kv`): on a 64-token Llama prefill, a copy kernel for the keys and one
for the values in every layer. `scaled_dot_product_attention(q, k, v, enable_gqa=True)` is the same
attention over the unrepeated heads (query head `h` reads key/value head `h // group`, as the repeat
laid them out), and the fused kernels that support it (flash attention, cuDNN) read the heads in
place. The others do not: SDPA then falls back to its math path, far slower than a copy. So the call
is rewritten only for the dtypes (with a mask or without) where ATen's own choice on this machine is
flash attention or cuDNN (`registry.facts.grouped_attention`, asked once per process).

CUDA, static sizes, several query rows (one row is `decode_attention`'s), head sizes up to 128, no
dropout.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Program, Ref, TensorMeta, meta_table
from opgen.runtime.passes.analysis import defined_at, readers, with_arg, writes_between, writes_memory
from opgen.runtime.passes.dead_code import eliminate_dead_code
from opgen.runtime.passes.repeat_kv import Operand, unrepeat
from opgen.runtime.registry import BindError, KernelRegistry, bind

SDPA = "aten.scaled_dot_product_attention.default"
MAX_HEAD = 128  # the head sizes flash attention and cuDNN both take


def read_grouped_heads(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    body = program.body
    producers, read_by = defined_at(body), readers(body)
    rewritten: dict[int, Line] = {}
    for index, line in enumerate(body):
        if isinstance(line, KernelCall) and line.target == SDPA and not writes_memory(line):
            call = _grouped(index, line, body, registry, metas, producers, read_by)
            if call is not None:
                rewritten[index] = call
    if not rewritten:
        return program
    program = replace(program, body=tuple(rewritten.get(i, line) for i, line in enumerate(body)))
    return eliminate_dead_code(program, registry)  # the repeats' lines, now unread


def _grouped(index: int, line: KernelCall, body: tuple[Line, ...], registry: KernelRegistry,
             metas: dict[str, TensorMeta], producers: dict[str, int],
             read_by: dict[str, set[int]]) -> KernelCall | None:  # fmt: skip
    info = registry.by_name.get(line.kernel)
    if info is None:
        return None
    try:
        values = bind(info, line.args, dict(line.kwargs))
    except BindError:
        return None
    if values.get("dropout_p") not in (0, 0.0) or values.get("enable_gqa"):
        return None
    operands = [values.get(n) for n in ("query", "key", "value")]
    if not all(isinstance(o, Ref) and o.name in metas for o in operands):
        return None
    q, k, v = (Operand(o.name, metas[o.name]) for o in operands)  # type: ignore[union-attr]
    mask = values.get("attn_mask")
    mask_meta = metas.get(mask.name) if isinstance(mask, Ref) else None
    if mask is not None and mask_meta is None:
        return None
    every = [q.meta, k.meta, v.meta, *([mask_meta] if mask_meta else [])]
    if any(len(m.shape) != 4 for m in (q.meta, k.meta, v.meta)) or q.meta.shape[2] == 1:
        return None
    if (q.meta.dtype, mask is not None) not in registry.facts.grouped_attention or q.meta.shape[3] > MAX_HEAD:
        return None  # ATen would fall back to its math path: the repeat's copies are cheaper
    if any(not m.is_static or not m.device.startswith("cuda") for m in every):
        return None
    members: list[int] = []
    (key, k_group), (value, v_group) = (unrepeat(o, body, metas, producers, read_by, index, members) for o in (k, v))
    if k_group == 1 or v_group != k_group or writes_between(body, min(members), index):
        return None  # no repeat, or one made before a write the grouped call would see
    for name, new in (("key", Ref(key.name)), ("value", Ref(value.name)), ("enable_gqa", True)):
        line = with_arg(line, info, name, new)
    return line
