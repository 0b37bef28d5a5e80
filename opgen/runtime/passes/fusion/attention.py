"""Decode attention: scaled-dot-product attention of one query position over a key/value cache, as
one generated Triton kernel that reads grouped key/value heads where they are.

A decode step attends with one new token: per head, one query row against every cached key. Eager
and the fused SDPA kernels pay a launch and a fixed cost of several microseconds for that small
problem, and grouped-query models first copy the cache for every query head (`repeat_kv` in
transformers, `repeat_interleave` in gpt-fast: `view(clone(expand(unsqueeze(cache, 2))))`, two
launches and the whole cache written once more, per layer). Here `scaled_dot_product_attention`
with one query row, no dropout and no causal flag (the mask, boolean or additive, carries the
positions) becomes one kernel that maps each query head to its key/value head and reads the cache
itself; the repeat's copies leave the program with it.

The kernel is a `FusedKernel` whose plan (`AttentionPlan`) `codegen.triton.attention` prints, bound like
the fusion pass's kernels: a multi-kernel choice between
it and the ATen calls it replaced (the repeat included), timed on the first call. CUDA, static
sizes, float16/bfloat16/float32, head sizes up to 256 (one that is no power of two, Phi-3's 96, padded to one, the
lanes past it masked).

A row's keys are shared among up to `splits` programs (flash-decoding), so that the launch has about
`TARGET_PROGRAMS` programs once the cache fills: a batch of one has a few dozen rows, each of which
would otherwise walk its whole cache alone. With more than one split, setup gives the kernel a
buffer for its programs' partial results and a zeroed counter per row (`fusion.split_buffers`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from opgen.runtime.ir import (
    Alloc,
    AttentionPlan,
    FusedKernel,
    KernelCall,
    Line,
    Program,
    Ref,
    TensorMeta,
    meta_table,
)
from opgen.runtime.passes.analysis import defined_at, fresh_namer, readers, writes_between, writes_memory
from opgen.runtime.passes.dead_code import eliminate_dead_code
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.passes.fusion.eager_attention import match_eager
from opgen.runtime.passes.fusion.split_buffers import split_buffers, written
from opgen.runtime.passes.repeat_kv import Operand, unrepeat
from opgen.runtime.registry import BindError, KernelRegistry, bind

# The public op (export keeps it), and the backend ops AOT autograd traces it to (what a torch.compile backend
# sees on a GPU: transformers' decode step reaches the backend as cuDNN attention after a repeat_kv copy).
SDPA = frozenset({
    "aten.scaled_dot_product_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
})  # fmt: skip
DTYPES = ("float16", "bfloat16", "float32")
MAX_HEAD = 256
TARGET_PROGRAMS = 512  # rows x splits to aim at: a few programs per SM of an H100/H200 (132 SMs)
MAX_SPLITS = 16
MIN_PIECE = 32  # keys: no more splits than pieces of this many (the smallest block)
GROUPED_FROM = 2  # query heads per key/value head from which one program takes the whole group


@dataclass(frozen=True, slots=True)
class DecodeAttention:
    """One match: where the SDPA call is, what the kernel reads, and the lines it replaces."""

    index: int  # the SDPA call in the body
    line: KernelCall
    query: Operand  # [B, H, 1, D]
    key: Operand  # [B, H / group, S, D]: the cache itself, not its repeat
    value: Operand
    mask: Operand | None  # broadcast to [B, H, 1, S]: bool (keep where true) or additive
    group: int  # query heads per key/value head
    scale: float | None  # None: 1 / sqrt(D)
    members: tuple[int, ...]  # body indices of the repeat's lines and the SDPA call (or eager chain), in order
    softcap: float | None = None  # the scores' cap (`cap * tanh(s / cap)`), a written-out chain's (Gemma-2)

    @property
    def heads(self) -> int:
        return int(self.query.meta.shape[1])  # type: ignore[arg-type]


def fuse_decode_attention(program: Program, registry: KernelRegistry) -> Program:
    found = list(find_decode_attention(program, registry))
    if not found:
        return program
    locals_, buffers = fresh_namer(program, "attention"), fresh_namer(program, "attention_split")
    placed, setup = [], list(program.setup)
    for match in found:
        plan = attention_plan(match)
        made = (split_buffers(next(buffers), plan.partial_elements, plan.programs, plan.query.device,
                              match.line.node) if plan.splits > 1 else ())  # fmt: skip
        setup += made
        placed.append((fused_kernel(program, match, plan, next(locals_), made), match.members, match.index))
    return eliminate_dead_code(place(replace(program, setup=tuple(setup)), placed), registry)


def splits_for(rows: int, length: int) -> int:
    """Programs per row: a power of two, up to TARGET_PROGRAMS in all, MAX_SPLITS a row, pieces of MIN_PIECE keys."""
    most = min(MAX_SPLITS, max(1, TARGET_PROGRAMS // rows), max(1, length // MIN_PIECE))
    return 1 << (most.bit_length() - 1)


def attention_plan(match: DecodeAttention) -> AttentionPlan:
    out = match.line.outputs[0]
    assert out is not None and out.meta is not None
    mask = match.mask.meta if match.mask is not None else None
    plan = AttentionPlan(match.query.meta, match.key.meta, match.value.meta, mask, out.meta, match.group, match.scale,
                         grouped=grouped(match), softcap=match.softcap)  # fmt: skip
    return replace(plan, splits=splits_for(plan.programs, int(match.key.meta.shape[2])))  # type: ignore[arg-type]


def grouped(match: DecodeAttention) -> bool:
    """A program per group of query rows (`codegen.triton.attention_grouped`): where a key/value head has at
    least GROUPED_FROM query heads, the heads are 16 wide or more (a dot's smallest side) and the mask, if
    any, is one row for every head."""
    dim = int(match.query.meta.shape[3])  # type: ignore[arg-type]
    one_row = match.mask is None or match.mask.meta.shape[1] == 1
    return match.group >= GROUPED_FROM and dim >= 16 and one_row


def find_decode_attention(program: Program, registry: KernelRegistry) -> Iterator[DecodeAttention]:
    """SDPA calls of one query row, and the attention chains written out by hand (`eager_attention`)."""
    metas = meta_table(program)
    body = program.body
    producers, read_by = defined_at(body), readers(body)
    for index, line in enumerate(body):
        if not isinstance(line, KernelCall) or writes_memory(line):
            continue
        if line.target in SDPA:
            match = _match(index, line, body, registry, metas, producers, read_by)
        else:
            eager = match_eager(index, line, body, metas, producers, read_by)
            match = None if eager is None else _checked(
                body[eager.out], eager.out, eager.query, (eager.key, eager.key_reader),  # type: ignore[arg-type]
                (eager.value, eager.value_reader), eager.mask, eager.scale, False, list(eager.members), body, metas,
                producers, read_by, eager.softcap)  # fmt: skip
        if match is not None:
            yield match


def _match(index: int, line: KernelCall, body: tuple[Line, ...], registry: KernelRegistry,
           metas: dict[str, TensorMeta], producers: dict[str, int],
           read_by: dict[str, set[int]]) -> DecodeAttention | None:  # fmt: skip
    info = registry.by_name.get(line.kernel)
    if info is None or not line.outputs or line.outputs[0] is None or line.outputs[0].meta is None:
        return None
    if any(o is not None for o in line.outputs[1:]):  # a backend op's log-sum-exp or seeds are read
        return None
    try:
        values = bind(info, line.args, dict(line.kwargs))
    except BindError:
        return None
    if values.get("dropout_p") not in (0, 0.0) or values.get("is_causal") not in (False, None):
        return None
    if values.get("return_debug_mask"):  # a backend op's
        return None
    mask_arg = values.get("attn_mask", values.get("attn_bias"))  # the public op's name, the backend ops'
    scale = values.get("scale")
    if scale is not None and not isinstance(scale, float | int):
        return None
    q, k, v = (_operand(values.get(n), metas) for n in ("query", "key", "value"))
    mask = _operand(mask_arg, metas)
    if q is None or k is None or v is None or (mask_arg is not None and mask is None):
        return None
    return _checked(line, index, q, (k, index), (v, index), mask, None if scale is None else float(scale),
                    bool(values.get("enable_gqa")), [index], body, metas, producers, read_by)  # fmt: skip


def _checked(line: KernelCall, index: int, q: Operand, k: tuple[Operand, int], v: tuple[Operand, int],
             mask: Operand | None, scale: float | None, gqa: bool, members: list[int], body: tuple[Line, ...],
             metas: dict[str, TensorMeta], producers: dict[str, int], read_by: dict[str, set[int]],
             softcap: float | None = None) -> DecodeAttention | None:  # fmt: skip
    """The match where the kernel can take it: `line` (at `index`, among `members`) writes the attention's
    output, `k` and `v` are read by the lines at the indices paired with them (a repeat of the cache
    before them joins `members`)."""
    out = line.outputs[0].meta if line.outputs and line.outputs[0] is not None else None
    if out is None or len(q.meta.shape) != 4:
        return None
    batch, heads, rows, dim = q.meta.shape  # type: ignore[misc]
    if rows != 1 or out.shape != q.meta.shape or not 0 < dim <= MAX_HEAD:  # type: ignore[operator]
        return None
    metas_all = [q.meta, k[0].meta, v[0].meta, out]
    if any(not m.is_static or not m.device.startswith("cuda") for m in [*metas_all, *([mask.meta] if mask else [])]):
        return None
    if len({m.device for m in metas_all}) != 1 or {m.dtype for m in metas_all} != {q.meta.dtype}:
        return None
    if q.meta.dtype not in DTYPES:
        return None
    (key, k_group), (value, v_group) = (unrepeat(o, body, metas, producers, read_by, at, members) for o, at in (k, v))
    group = k_group
    if gqa and k_group == 1 and key.meta.shape[1] != heads:
        group = heads // key.meta.shape[1] if heads % key.meta.shape[1] == 0 else 0  # type: ignore[operator]
        v_group = group if v_group == 1 and value.meta.shape[1] == key.meta.shape[1] else 0
    if group < 1 or v_group != group or key.meta.shape != value.meta.shape:
        return None
    kb, kh, length, kd = key.meta.shape  # type: ignore[misc]
    if kb != batch or kh * group != heads or kd != dim:  # type: ignore[operator]
        return None
    if mask is not None and not _mask_fits(mask.meta, batch, heads, length):  # type: ignore[arg-type]
        return None
    if writes_between(body, min(members), index):
        return None  # the repeat copied the cache before a write that the kernel would see
    return DecodeAttention(index, line, q, key, value, mask, group, scale, tuple(sorted(set(members))), softcap)


def _operand(arg: object, metas: dict[str, TensorMeta]) -> Operand | None:
    if not isinstance(arg, Ref) or arg.name not in metas:
        return None
    meta = metas[arg.name]
    return Operand(arg.name, meta) if len(meta.shape) == 4 else None


def _mask_fits(meta: TensorMeta, batch: int, heads: int, length: int) -> bool:
    """Broadcast to [B, H, 1, S] along its size-1 dims: a boolean mask, or an additive one of a float type."""
    if len(meta.shape) != 4 or meta.shape[2] != 1 or meta.shape[3] != length:
        return False
    if meta.shape[0] not in (1, batch) or meta.shape[1] not in (1, heads):
        return False
    return meta.dtype == "bool" or meta.dtype in DTYPES


def fused_kernel(program: Program, match: DecodeAttention, plan: AttentionPlan, local: str,
                 buffers: tuple[Alloc, KernelCall] | tuple[()] = ()) -> FusedKernel:  # fmt: skip
    lines = tuple(program.body[i] for i in match.members)
    inputs = (match.query.name, match.key.name, match.value.name, *((match.mask.name,) if match.mask else ()))
    dtypes = (match.query.meta.dtype,) * 3 + ((match.mask.meta.dtype,) if match.mask else ())
    scratch = written(buffers)
    length = match.key.meta.shape[2]
    return FusedKernel.make(
        local,
        plan,
        inputs=(*zip(inputs, dtypes, strict=True), *((v.name, v.meta.dtype) for v in scratch)),  # type: ignore[union-attr]
        outputs=match.line.outputs[:1],  # type: ignore[arg-type]
        nodes=(line.node for line in lines if isinstance(line, KernelCall)),
        describe=f"decode attention, {match.heads} heads of one query over {length} keys"
        + (f" ({match.group} per key/value head, read in place)" if match.group > 1 else "")
        + (f", scores soft-capped at {plan.softcap:g}" if plan.softcap is not None else "")
        + (", a program a group" if plan.grouped else "")
        + (f", up to {plan.splits} programs a {'group' if plan.grouped else 'head'}" if plan.splits > 1 else ""),
        lines=lines,  # type: ignore[arg-type]
        writes=scratch,
    )
