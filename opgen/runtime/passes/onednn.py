"""oneDNN on CPU: convolutions on constant weights as prepacked oneDNN kernels with fused post-ops, in channels-last.

Three rewrites of 2-d float32 CPU convolutions, after batch-norm folding (the CPU analogue of
`cudnn.py`, and of what Inductor's `mkldnn_fusion.py` does under freezing):

1. Packing: `convolution(x, W, b, ...)` with a constant weight (and at least `MIN_MACS`
   multiply-adds: oneDNN's fixed cost per call makes tiny convolutions slower; grouped ones with a
   kernel over 1x1 at any size, as ATen calls oneDNN for those itself) becomes
   `kernel_ops.mkldnn_convolution_pointwise(x, P, b, padding, stride, dilation, groups, "none", (), "")`,
   `P = mkldnn._reorder_convolution_weight(W, ..., input size)` computed once, at bind time, in
   oneDNN's blocked layout for that input size: no weight reorder per call.
2. Post-ops: a unary activation (relu, gelu, silu, sigmoid, tanh, hardswish, hardsigmoid,
   leaky_relu, hardtanh) that is the only reader of such a convolution becomes its post-op, and
   `add(conv(x), z)` (alpha 1, `z` of the same shape), optionally followed by relu, becomes
   `kernel_ops.mkldnn_convolution_pointwise_binary(x, z, P, b, ..., "add", 1.0, "relu"|None, (), "")`.
3. Layout: the region of values these convolutions produce, and relu/add/activations/max pooling/
   constant pads of region values, runs channels-last (oneDNN's fast layout: no input/output reorders); a
   convolution input from outside the region is copied in once, and every region value that
   something else reads (a mean, a view, the caller) is copied back to the contiguous layout the
   graph recorded.

Measured on this kind of machine, 1 thread (10x64x56x56, 3x3, 64 channels): aten convolution on
contiguous input + relu 42 ms; the fused packed channels-last call 21-26 ms. The convolutions are
kernel_ops functions (opgen's own kernels calling torch's at::native oneDNN functions directly, no
dispatcher); only the weight packing, once per weight in setup, goes through torch.ops (and
`compiled.report()` lists it). The pipeline runs
this pass only where oneDNN is available (`opgen.runtime.pipeline.default_pipeline`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from opgen.runtime.ir import (
    Arg,
    KernelCall,
    Line,
    Program,
    Ref,
    Sym,
    TensorMeta,
    Value,
    meta_table,
    substitute_line,
    uses,
)
from opgen.runtime.passes.analysis import arg_value, constant_names, fresh_namer, use_counts
from opgen.runtime.passes.layout import channels_last as channels_last_meta
from opgen.runtime.passes.layout import exit_copies
from opgen.runtime.registry import KernelRegistry

CONV = "convolution"
PACK = "mkldnn._reorder_convolution_weight.default"
CONV_UNARY = "mkldnn_convolution_pointwise"  # kernel_ops functions (ops.yaml)
CONV_BINARY = "mkldnn_convolution_pointwise_binary"
CHANNELS_LAST = (("memory_format", Sym("memory_format", "channels_last")),)
# kernel_ops activation -> (oneDNN attr, the names of its scalar arguments, in oneDNN's order)
UNARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "relu": ("relu", ()),
    "gelu": ("gelu", ()),
    "silu": ("swish", ()),
    "sigmoid": ("sigmoid", ()),
    "tanh": ("tanh", ()),
    "hardswish": ("hardswish", ()),
    "hardsigmoid": ("hardsigmoid", ()),
    "leaky_relu": ("leaky_relu", ("negative_slope",)),
    "hardtanh": ("hardtanh", ("min_val", "max_val")),
}
REGION_POINTWISE = {"relu", "add", *UNARY}
REGION_PADS = {"constant_pad_nd"}  # ATen pads in the input's memory format: channels-last stays channels-last
# Below this many multiply-adds oneDNN's fixed cost per call (about 20 us here) loses to ATen's own
# convolution: 3x3 16->16 channels on 8x8 takes 13 us through ATen and 24 us through oneDNN, on
# 16x16 29 and 28 us, on 32x32 142 and 100 us.
MIN_MACS = 1 << 18


def _conv_args(
    line: Line, constant: set[str], metas: dict[str, TensorMeta], registry: KernelRegistry
) -> tuple[Arg, ...] | None:
    """(x, W, b, stride, padding, dilation, groups) of a 2-d float32 CPU convolution on a constant weight."""
    if not isinstance(line, KernelCall) or line.kernel != CONV or line.fallback or len(line.outputs) != 1:
        return None
    out, info = line.outputs[0], registry.by_name[CONV]
    meta = out.meta if out is not None else None
    if meta is None or len(meta.shape) != 4 or meta.device != "cpu" or meta.dtype != "float32":
        return None
    if any(type(n) is not int for n in meta.shape):  # symbolic sizes: the weight is packed for one input size
        return None
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    args = tuple(arg_value(line, info, n) for n in names)
    x, weight, bias = args[:3]
    if arg_value(line, info, "transposed") is not False or not isinstance(x, Ref) or x.name not in metas:
        return None
    if not isinstance(weight, Ref) or weight.name not in constant or len(metas[weight.name].shape) != 4:
        return None
    w_shape = metas[weight.name].shape
    if meta.numel * math.prod(w_shape[1:]) < MIN_MACS and not _aten_calls_onednn(w_shape, args[6]):
        return None
    if not (bias is None or isinstance(bias, Ref)) or not all(isinstance(a, tuple) for a in args[3:6]):
        return None
    return args


def _aten_calls_onednn(weight_shape: tuple[object, ...], groups: Arg) -> bool:
    """A grouped convolution with a kernel larger than 1x1 (depthwise 3x3, ...): ATen runs it through oneDNN
    itself, on the unpacked weight in NCHW, so the packed channels-last call wins at any size (a 3x3
    depthwise convolution of 96x18x18: 55 us through ATen, 21 us packed; oneDNN's fixed cost dominates)."""
    return type(groups) is int and groups > 1 and tuple(weight_shape[2:]) != (1, 1)


def pack(program: Program, registry: KernelRegistry) -> Program:
    """Step 1: convolutions on constant weights call oneDNN with the weight packed once, in setup."""
    constant, metas = constant_names(program), meta_table(program)
    names = fresh_namer(program, "packed")
    setup, body = list(program.setup), []
    packed: dict[tuple[object, ...], str] = {}
    for line in program.body:
        args = _conv_args(line, constant, metas, registry)
        if args is None:
            body.append(line)
            continue
        assert isinstance(line, KernelCall)
        x, weight, bias, stride, padding, dilation, groups = args
        assert isinstance(x, Ref) and isinstance(weight, Ref)
        key = (weight.name, stride, padding, dilation, groups, metas[x.name].shape)
        if key not in packed:
            packed[key] = next(names)
            pack_args = (weight, padding, stride, dilation, groups, metas[x.name].shape)
            setup.append(
                KernelCall(PACK, pack_args, (), (Value(packed[key]),), line.node, PACK, fallback=True, fresh=True)
            )
        conv_args = (x, Ref(packed[key]), bias, padding, stride, dilation, groups, "none", (), "")
        target = f"{line.target} as {CONV_UNARY}"
        body.append(
            replace(line, kernel=CONV_UNARY, args=conv_args, kwargs=(), target=target, fallback=False, fresh=True)
        )
    return replace(program, setup=tuple(setup), body=tuple(body))


def unary_post_op(line: Line, source: str, registry: KernelRegistry) -> tuple[str, tuple[float, ...], str] | None:
    """(attr, scalars, algorithm) if `line` is an activation of `source` oneDNN can fuse as a post-op."""
    if not isinstance(line, KernelCall) or line.fallback or line.kernel not in UNARY or len(line.outputs) != 1:
        return None
    if not line.args or line.args[0] != Ref(source) or line.kernel not in registry.by_name:
        return None
    attr, scalar_names = UNARY[line.kernel]
    info = registry.by_name[line.kernel]
    if any(a.name not in (*scalar_names, "approximate") for a in info.args[1:]):
        return None
    scalars = tuple(arg_value(line, info, n) for n in scalar_names)
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scalars):
        return None
    algorithm = arg_value(line, info, "approximate") if line.kernel == "gelu" else ""
    if line.kernel == "gelu" and algorithm not in ("none", "tanh"):
        return None
    return attr, tuple(float(s) for s in scalars), str(algorithm)  # type: ignore[arg-type]


def _single_reader(body: list[Line | None], start: int, name: str) -> int | None:
    return next((j for j in range(start + 1, len(body)) if body[j] is not None and name in uses(body[j])), None)  # type: ignore[arg-type]


def _binary(add: Line, source: str, metas: dict[str, TensorMeta]) -> Arg | None:
    """The other operand `z` if `add` is `source + z` or `z + source` (alpha 1, same shape and dtype)."""
    if not isinstance(add, KernelCall) or add.kernel != "add" or add.fallback or len(add.args) != 2:
        return None
    if dict(add.kwargs).get("alpha", 1) != 1 or len(add.outputs) != 1:
        return None
    a, b = add.args
    z = b if a == Ref(source) else a if b == Ref(source) else None
    if not isinstance(z, Ref) or z.name == source or z.name not in metas:
        return None
    same = metas[z.name].shape == metas[source].shape and metas[z.name].dtype == metas[source].dtype
    return z if same and _spatial(metas[source]) > 1 else None


def _spatial(meta: TensorMeta) -> int:
    """Positions per channel of an NCHW value. At one position (1x1) oneDNN's binary post-op fails on
    AVX-512 machines: the brgemm convolution accepts `binary_add` there, then creating the memory of the
    second operand fails ("could not create a memory", seen on a Xeon with AVX-512 for ResNet-18's last
    stage at 32x32 input; AVX2 machines pick another kernel and run it). Such a convolution keeps its
    add as an ATen call; a 1x1 map is a tiny convolution, so nothing measurable is lost."""
    return math.prod(int(n) for n in meta.shape[2:])  # type: ignore[call-overload]


def fuse(program: Program, registry: KernelRegistry) -> Program:
    """Step 2: activations and residual adds reading a packed convolution become its post-ops."""
    body: list[Line | None] = list(program.body)
    counts, metas = use_counts(body), meta_table(program)
    for i, line in enumerate(body):
        if not isinstance(line, KernelCall) or line.kernel != CONV_UNARY or line.args[7] != "none":
            continue
        out = line.outputs[0]
        user = _single_reader(body, i, out.name) if out is not None and counts[out.name] == 1 else None
        if out is None or user is None:
            continue
        reader = body[user]
        if not isinstance(reader, KernelCall):
            continue
        if (post := unary_post_op(reader, out.name, registry)) is not None:
            args = (*line.args[:7], *post)
            body[i] = replace(line, args=args, outputs=reader.outputs, node=f"{line.node}+{reader.node}",
                              target=f"{line.target}+{reader.kernel}")  # fmt: skip
            body[user] = None
            continue
        z = _binary(reader, out.name, metas)
        if z is None:
            continue
        body[i], body[user] = _fused_add(line, reader, z, body, user, counts, registry)
    return replace(program, body=tuple(line for line in body if line is not None))


def _fused_add(
    conv: KernelCall,
    add: KernelCall,
    z: Arg,
    body: list[Line | None],
    at: int,
    counts: dict[str, int],
    registry: KernelRegistry,
) -> tuple[Line | None, Line | None]:
    """conv + z (+ relu where relu is the sum's only reader) as one binary call, placed at the add."""
    x, w, b, padding, stride, dilation, groups = conv.args[:7]
    result = add.outputs[0]
    assert result is not None
    unary: str | None = None
    outputs, node = add.outputs, f"{conv.node}+{add.node}"
    relu_at = _single_reader(body, at, result.name) if counts[result.name] == 1 else None
    relu = body[relu_at] if relu_at is not None else None
    if relu is not None and (post := unary_post_op(relu, result.name, registry)) is not None and post[0] == "relu":
        assert isinstance(relu, KernelCall) and relu_at is not None
        unary, outputs, node = "relu", relu.outputs, f"{node}+{relu.node}"
        body[relu_at] = None
    args = (x, z, w, b, padding, stride, dilation, groups, "add", 1.0, unary, (), "")
    fused = replace(conv, kernel=CONV_BINARY, args=args, outputs=outputs, node=node,
                    target=f"{conv.target}+add{'+relu' if unary else ''}".replace(CONV_UNARY, CONV_BINARY))  # fmt: skip
    return None, fused


def channels_last(program: Program, registry: KernelRegistry) -> Program:
    """Step 3: the channels-last region rooted at the packed convolutions."""
    metas = meta_table(program)
    names = fresh_namer(program, "cl")
    body: list[Line] = []
    region: dict[str, str] = {}  # value -> its channels-last name
    for line in program.body:
        if not _joins_region(line, region):
            body.append(line)
            continue
        assert isinstance(line, KernelCall) and line.outputs[0] is not None and line.outputs[0].meta is not None
        mapping: dict[str, Arg] = {n: Ref(cl) for n, cl in region.items()}
        for operand in _conv_operands(line):
            if operand.name not in region and operand.name in metas and len(metas[operand.name].shape) == 4:
                cl_in = Value(next(names), channels_last_meta(metas[operand.name]))
                body.append(KernelCall("clone", (operand,), CHANNELS_LAST, (cl_in,), line.node, "channels-last input"))
                mapping[operand.name] = Ref(cl_in.name)
        out = line.outputs[0]
        cl_out = Value(next(names), channels_last_meta(out.meta))
        region[out.name] = cl_out.name
        body.append(replace(substitute_line(line, mapping), outputs=(cl_out, *line.outputs[1:])))  # type: ignore[type-var]
    if not region:
        return program
    return replace(program, body=tuple(exit_copies(body, region, metas)))


def _conv_operands(line: KernelCall) -> list[Ref]:
    """The activations a packed convolution reads (x, and z of the binary form)."""
    if line.kernel == CONV_UNARY:
        return [a for a in line.args[:1] if isinstance(a, Ref)]
    if line.kernel == CONV_BINARY:
        return [a for a in line.args[:2] if isinstance(a, Ref)]
    return []


def _joins_region(line: Line, region: dict[str, str]) -> bool:
    """A packed convolution, or a pointwise op / max pooling whose tensor operands are all region values."""
    if not isinstance(line, KernelCall) or not line.outputs or line.outputs[0] is None:
        return False
    meta = line.outputs[0].meta
    if meta is None or len(meta.shape) != 4 or meta.device != "cpu":
        return False
    if line.kernel in (CONV_UNARY, CONV_BINARY):
        return True
    refs = [a.name for a in line.args if isinstance(a, Ref)]
    if line.fallback or not refs or not all(r in region for r in refs):
        return False
    if line.kernel == "max_pool2d_with_indices":
        return line.outputs[1:] == (None,)
    return (
        line.kernel in REGION_POINTWISE | REGION_PADS
        and len(line.outputs) == 1
        and all(not isinstance(v, Ref) for _, v in line.kwargs)
    )


def fuse_onednn(program: Program, registry: KernelRegistry) -> Program:
    if not {CONV, CONV_UNARY, CONV_BINARY, "clone"} <= set(registry.by_name):
        return program
    return channels_last(fuse(pack(program, registry), registry), registry)
