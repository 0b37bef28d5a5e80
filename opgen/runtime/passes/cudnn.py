"""cuDNN on CUDA: fused convolutions, run in channels-last.

Two rewrites of 2-d convolutions on CUDA (float32, float16, bfloat16), after batch-norm folding:

1. Fusion: `relu(conv(x, W, b))` becomes `cudnn_convolution_relu(x, W, b, ...)` and
   `relu(conv(x, W, b) + z)` becomes `cudnn_convolution_add_relu(x, W, z, 1, b, ...)` (ungrouped,
   undilated convolutions: cuDNN has no engine for some others), where the intermediate values
   have no other reader: one cuDNN kernel instead of three launches.
2. Layout: convolutions with a constant weight run in channels-last (cuDNN's fast layout on
   tensor-core GPUs): the weight is copied to channels-last once, at bind time, so cuDNN returns
   channels-last results, and relu, add and max pooling of such results stay channels-last, as do
   other pointwise nodes and per-channel means of them (`region_ops`: SiLU, squeeze-excitation). Every
   value of such a region that something else reads (a mean, a view, the caller) is copied back to
   the contiguous layout the graph recorded, so nothing outside the region sees another layout.

Measured on an H100 (one 64-channel 3x3 convolution on 1x64x56x56, torch 2.11): conv + relu 52 us
of host and GPU time per call; fused 37 us; fused and channels-last 27 us. The pipeline runs this
pass only where cuDNN is available (`opgen.runtime.pipeline.default_pipeline`).
"""

from __future__ import annotations

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
)
from opgen.runtime.passes.analysis import arg_value, constant_names, fresh_namer, readers, use_counts
from opgen.runtime.passes.layout import channels_last as channels_last_meta
from opgen.runtime.passes.layout import exit_copies
from opgen.runtime.passes.region_ops import region_meta, region_view
from opgen.runtime.registry import KernelRegistry

CONV, RELU, ADD, POOL = "convolution", "relu", "add", "max_pool2d_with_indices"
CONV_RELU, CONV_ADD_RELU = "cudnn_convolution_relu", "cudnn_convolution_add_relu"
DTYPES = ("float32", "float16", "bfloat16")
CHANNELS_LAST = (("memory_format", Sym("memory_format", "channels_last")),)


def _call(line: Line | None, kernel: str) -> KernelCall | None:
    return line if isinstance(line, KernelCall) and line.kernel == kernel and not line.fallback else None


def _conv_args(line: KernelCall, registry: KernelRegistry) -> tuple[Arg, ...] | None:
    """(x, W, b, stride, padding, dilation, groups) of a 2-d CUDA convolution cuDNN can fuse."""
    info = registry.by_name[CONV]
    out = line.outputs[0] if len(line.outputs) == 1 else None
    meta = out.meta if out is not None else None
    if meta is None or len(meta.shape) != 4 or not meta.device.startswith("cuda") or meta.dtype not in DTYPES:
        return None
    if arg_value(line, info, "transposed") is not False:
        return None
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    return tuple(arg_value(line, info, n) for n in names)


def _plain_conv(args: tuple[Arg, ...]) -> bool:
    """Ungrouped and undilated: cuDNN has no fused conv-add-relu engine for some grouped or dilated ones."""
    *_, dilation, groups = args
    return groups == 1 and isinstance(dilation, tuple) and all(d == 1 for d in dilation)


def fuse(program: Program, registry: KernelRegistry) -> Program:
    """Step 1: conv -> relu and conv -> add -> relu chains become one fused cuDNN call."""
    body: list[Line | None] = list(program.body)
    readers = use_counts(body)
    producer = {v.name: i for i, line in enumerate(body) if isinstance(line, KernelCall) for v in line.outputs if v}

    def single_conv(arg: object) -> tuple[int, tuple[Arg, ...]] | None:
        if not isinstance(arg, Ref) or readers[arg.name] != 1 or arg.name not in producer:
            return None
        index = producer[arg.name]
        conv = _call(body[index], CONV)
        args = _conv_args(conv, registry) if conv is not None else None
        return (index, args) if args is not None else None

    metas = meta_table(program)
    for i, line in enumerate(body):
        relu = _call(line, RELU)
        if relu is None or relu.kwargs or len(relu.args) != 1:
            continue
        (source,) = relu.args
        if (match := single_conv(source)) is not None:
            index, (x, w, b, stride, padding, dilation, groups) = match
            body[index] = None
            body[i] = replace(relu, kernel=CONV_RELU, args=(x, w, b, stride, padding, dilation, groups),
                              target=f"{relu.target} fused with its convolution")  # fmt: skip
            continue
        add = _call(body[producer[source.name]], ADD) if isinstance(source, Ref) and source.name in producer else None
        if add is None or readers[source.name] != 1 or dict(add.kwargs).get("alpha", 1) != 1 or len(add.args) != 2:
            continue
        for conv_arg, z in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
            match = single_conv(conv_arg)
            same = isinstance(z, Ref) and isinstance(conv_arg, Ref) and metas.get(z.name) == metas.get(conv_arg.name)
            if match is None or not same or not _plain_conv(match[1]):
                continue
            index, (x, w, b, stride, padding, dilation, groups) = match
            body[index] = body[producer[source.name]] = None
            body[i] = replace(relu, kernel=CONV_ADD_RELU, args=(x, w, z, 1, b, stride, padding, dilation, groups),
                              target=f"{relu.target} fused with its convolution and add")  # fmt: skip
            break
    return replace(program, body=tuple(line for line in body if line is not None))


def channels_last(program: Program, registry: KernelRegistry) -> Program:
    """Step 2: the channels-last region rooted at convolutions with constant weights."""
    constant, metas = constant_names(program), meta_table(program)
    names = fresh_namer(program, "cl")
    setup, body = list(program.setup), []
    region: dict[str, str] = {}  # value -> its channels-last name
    region_metas: dict[str, TensorMeta] = {}  # value -> the meta of its channels-last copy
    packed: dict[str, str] = {}  # weight -> channels-last copy
    read_by = readers(program.body)
    for line in program.body:
        joined = _joins_region(line, region, constant, metas, registry)
        other = region_meta(line, region_metas, metas) if not joined and isinstance(line, KernelCall) else None
        view = None if joined or other else region_view(line, region_metas, program.body, read_by)
        if view is not None:  # a permute read by layer norms: it views the channels-last value itself
            assert isinstance(line, KernelCall) and line.outputs[0] is not None
            mapping = {n: Ref(cl) for n, cl in region.items()}
            body.append(replace(substitute_line(line, mapping), outputs=(Value(line.outputs[0].name, view),)))  # type: ignore[type-var]
            continue
        if not joined and other is None:
            body.append(line)
            continue
        assert isinstance(line, KernelCall)
        weight = line.args[1] if line.kernel in (CONV, CONV_RELU, CONV_ADD_RELU) else None
        if isinstance(weight, Ref) and weight.name not in packed:
            packed[weight.name] = next(names)
            cl_meta = channels_last_meta(metas[weight.name])
            setup.append(KernelCall("clone", (weight,), CHANNELS_LAST, (Value(packed[weight.name], cl_meta),),
                                    line.node, "channels-last weight"))  # fmt: skip
        mapping = {n: Ref(cl) for n, cl in region.items()} | {w: Ref(cl) for w, cl in packed.items()}
        out = line.outputs[0]
        assert out is not None and out.meta is not None
        cl_out = Value(next(names), other or channels_last_meta(out.meta))
        region[out.name], region_metas[out.name] = cl_out.name, cl_out.meta  # type: ignore[assignment]
        outputs = (cl_out, *line.outputs[1:])
        body.append(replace(substitute_line(line, mapping), outputs=outputs))  # type: ignore[type-var]
    if not packed:
        return program
    return replace(program, setup=tuple(setup), body=tuple(exit_copies(body, region, metas)))


def _joins_region(
    line: Line, region: dict[str, str], constant: set[str], metas: dict[str, TensorMeta], registry: KernelRegistry
) -> bool:
    """Whether `line` runs channels-last: a convolution with a constant weight, or relu/add/pooling of such results."""
    if not isinstance(line, KernelCall) or line.fallback or not line.outputs or line.outputs[0] is None:
        return False
    meta = line.outputs[0].meta
    if meta is None or len(meta.shape) != 4 or not meta.device.startswith("cuda") or meta.dtype not in DTYPES:
        return False
    refs = [a.name for a in line.args if isinstance(a, Ref)]
    match line.kernel:
        case "convolution" | "cudnn_convolution_relu" | "cudnn_convolution_add_relu":
            weight = line.args[1]
            packable = isinstance(weight, Ref) and weight.name in constant and len(metas[weight.name].shape) == 4
            return packable and (line.kernel != CONV or _conv_args(line, registry) is not None)
        case "relu":
            return bool(refs) and all(r in region for r in refs) and not line.kwargs
        case "add":
            same = len(refs) == 2 and metas.get(refs[0]) == metas.get(refs[1])
            return same and all(r in region for r in refs) and dict(line.kwargs).get("alpha", 1) == 1
        case "max_pool2d_with_indices":
            return bool(refs) and refs[0] in region and line.outputs[1:] == (None,)
    return False


def fuse_cudnn(program: Program, registry: KernelRegistry) -> Program:
    if not {CONV, CONV_RELU, CONV_ADD_RELU, "clone"} <= set(registry.by_name):
        return program
    return channels_last(fuse(program, registry), registry)
