"""Boolean attention masks made additive once, not once per attention call.

`scaled_dot_product_attention` with a boolean `attn_mask` (keep where true) first turns it into an
additive one in the query's dtype, inside ATen, on every call: on CUDA two fills and a `where`,
three launches per layer, although every layer of a transformer reads the same mask. Here each
(mask, dtype) pair is converted once, where the first attention call reads it, as ATen does it:
0 where the mask is true, -inf where it is false (`logical_not`, `zeros_like`, `masked_fill`), and
every attention call reads the result (a mask that exists before the first call, a constant causal
mask, is converted in setup, once). Partly masked rows give the same numbers as before; ATen's
cuDNN path fills with -65504 instead of -inf, which differs only on rows with no key kept, where
ATen's own backends disagree (0, NaN, or unmasked attention).

Static sizes only. Runs after `decode_attention`, whose kernel reads a boolean mask itself.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Program, Ref, Sym, TensorMeta, Value, contiguous_strides, meta_table
from opgen.runtime.passes.analysis import arg_value, fresh_namer, info_of, setup_names, with_arg
from opgen.runtime.registry import KernelRegistry

SDPA = "scaled_dot_product_attention"
CONTIGUOUS = Sym("memory_format", "contiguous_format")


def additive_masks(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    names = fresh_namer(program, "mask")
    early = setup_names(program)
    converted: dict[tuple[str, str], str] = {}  # (boolean mask, dtype) -> its additive mask
    setup, body = list(program.setup), []
    for line in program.body:
        found = _boolean_mask(line, registry, metas)
        if found is None:
            body.append(line)
            continue
        mask, dtype = found
        key = (mask, dtype)
        if key not in converted:
            converted[key] = next(names)
            lines = _convert(mask, metas[mask], dtype, converted[key], next(names), next(names), line.node)
            (setup if mask in early else body).extend(lines)  # a constant mask: converted once, at load
        body.append(with_arg(line, registry.by_name[line.kernel], "attn_mask", Ref(converted[key])))
    return program if not converted else replace(program, setup=tuple(setup), body=tuple(body))


def _boolean_mask(line: Line, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> tuple[str, str] | None:
    """(mask, query dtype) of an attention call with a static boolean mask."""
    if not isinstance(line, KernelCall) or line.kernel != SDPA or (info := info_of(line, registry)) is None:
        return None
    mask, query = arg_value(line, info, "attn_mask"), arg_value(line, info, "query")
    if not isinstance(mask, Ref) or not isinstance(query, Ref):
        return None
    mask_meta, query_meta = metas.get(mask.name), metas.get(query.name)
    if mask_meta is None or query_meta is None or mask_meta.dtype != "bool" or not mask_meta.is_static:
        return None
    return mask.name, query_meta.dtype


def _convert(mask: str, meta: TensorMeta, dtype: str, out: str, inverted: str, zeros: str, node: str) -> list[Line]:
    """`out = masked_fill(zeros_like(mask, dtype), logical_not(mask), -inf)`: ATen's own conversion."""
    dense = contiguous_strides(meta.shape)  # type: ignore[arg-type]
    bools = Value(inverted, TensorMeta(meta.shape, dense, "bool", meta.device))
    floats = TensorMeta(meta.shape, dense, dtype, meta.device)
    like = (("dtype", Sym("dtype", dtype)), ("memory_format", CONTIGUOUS))
    fill = (Ref(zeros), Ref(inverted), Sym("float", "-inf"))
    return [
        KernelCall("logical_not", (Ref(mask),), (), (bools,), node, "aten.logical_not.default"),
        KernelCall("zeros_like", (Ref(mask),), like, (Value(zeros, floats),), node, "aten.zeros_like.default"),
        KernelCall("masked_fill", fill, (), (Value(out, floats),), node, "aten.masked_fill.Scalar"),
    ]
