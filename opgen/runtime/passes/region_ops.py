"""Which calls besides convolutions, relu, add and pooling join a channels-last region (`cudnn`):
pointwise nodes and per-channel means of its values.

EfficientNet and MobileNetV3 put SiLU or hardswish and a squeeze-excitation (a mean over H and W, two
1x1 convolutions, a sigmoid, a scale) between their convolutions. Outside the region, each of those
values came back in the graph's NCHW layout and cuDNN copied the next convolution's input to
channels-last again: on EfficientNet-B0 (H100, batch 4) 33 copies, 207 us of a 1031 us call. In the
region they run on channels-last values, and the fusion pass's kernels read and write that layout.

A call joins where its output has the rank-4 shape of a region value it reads and every operand of
that shape is a region value (an operand that broadcasts, such as the excitation's [N, C, 1, 1]
scale, may be anything); a mean joins where it reduces a region value over H and W, keeping them.
Its result's strides are those ATen's TensorIterator gives these operands (checked against torch
in tests/runtime/test_region_ops.py): channels-last where H and W are both over 1, and the dense
NCHW strides of an [N, C, 1, 1] result (ATen's mean and pointwise kernels return those even for a
channels-last [N, C, 1, 1] operand, as a 1x1 convolution's result is). Other shapes stay outside.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Ref, Sym, TensorMeta, contiguous_strides
from opgen.runtime.ir.fusible import PERMUTE, POINTWISE
from opgen.runtime.passes.layout import channels_last_strides

MEAN, NORM = "aten.mean.dim", "aten.native_layer_norm.default"
SPATIAL = ({2, 3}, {-1, -2})  # H and W of an NCHW tensor, as dims


def region_meta(
    line: KernelCall, region: Mapping[str, TensorMeta], metas: Mapping[str, TensorMeta]
) -> TensorMeta | None:
    """The result's meta where `line` joins the region (`region`: value -> its channels-last meta), else None."""
    out = line.outputs[0] if len(line.outputs) == 1 else None
    if out is None or out.meta is None or len(out.meta.shape) != 4 or line.fallback or line.mutates:
        return None
    args = (*line.args, *(v for _, v in line.kwargs))
    tensors = [a.name for a in args if isinstance(a, Ref)]
    if not tensors or any(n not in metas or not metas[n].is_static for n in tensors) or not out.meta.is_static:
        return None
    if any(isinstance(a, Sym) and a.kind == "memory_format" and a.value != "preserve_format" for a in args):
        return None  # a copy to a named layout (`clone(memory_format=...)`) has that layout
    if line.target == MEAN:
        source = region.get(tensors[0])
        if not spatial_mean(line) or source is None or _layout(source) != "channels_last":
            return None
        return _strided(out.meta, "dense")
    if line.target not in POINTWISE:
        return None
    full = [region.get(n) for n in tensors if metas[n].shape == out.meta.shape]
    layouts = {_layout(m) if m is not None else None for m in full}
    if not full or len(layouts) != 1 or None in layouts:
        return None
    return _strided(out.meta, layouts.pop())  # type: ignore[arg-type]


def region_view(
    line: Line, region: Mapping[str, TensorMeta], body: Sequence[Line], read_by: Mapping[str, set[int]]
) -> TensorMeta | None:
    """The meta of a permute of a region value that only layer norms read (ConvNeXt's `permute(0, 2, 3, 1)`
    before its norm; `read_by`: value -> the indices of the `body` lines reading it), viewing the
    channels-last value itself: (N, H, W, C), dense. A layer norm's results are contiguous whatever its
    input's strides, so no recorded meta after it changes; the norm then reads dense rows where it
    read a copy back to NCHW, permuted."""
    if not isinstance(line, KernelCall) or line.target != PERMUTE or line.fallback or len(line.outputs) != 1:
        return None
    source, out = (line.args[0] if line.args else None), line.outputs[0]
    meta = region.get(source.name) if isinstance(source, Ref) else None
    dims = line.args[1] if len(line.args) > 1 else dict(line.kwargs).get("dims")
    if meta is None or out is None or out.meta is None or not isinstance(dims, tuple) or len(dims) != 4:
        return None
    readers = [body[i] for i in read_by.get(out.name, ())]
    if not readers or any(not _reads_as_norm(r, out.name) for r in readers):
        return None
    order = [d % 4 for d in dims if isinstance(d, int)]
    if sorted(order) != [0, 1, 2, 3]:
        return None
    return replace(out.meta, stride=tuple(meta.stride[d] for d in order))


def _reads_as_norm(line: Line, name: str) -> bool:
    """`line` is a layer norm of `name` (its input) that reads it nowhere else."""
    if not isinstance(line, KernelCall) or line.target != NORM or line.fallback or not line.args:
        return False
    rest = (*line.args[1:], *(v for _, v in line.kwargs))
    return line.args[0] == Ref(name) and Ref(name) not in rest


def _layout(meta: TensorMeta) -> str | None:
    """ "channels_last" for a channels-last tensor with C, H and W over 1, "dense" for a dense [N, C, 1, 1]
    (a 1x1 convolution's channels-last result or a mean's NCHW one: the same memory)."""
    n, c, h, w = meta.shape
    if h == w == 1:
        dense = (n == 1 or meta.stride[0] == c) and (c == 1 or meta.stride[1] == 1)
        return "dense" if dense else None
    if c != 1 and h != 1 and w != 1 and meta.stride == channels_last_strides(meta.shape):
        return "channels_last"
    return None


def _strided(meta: TensorMeta, layout: str) -> TensorMeta | None:
    _, c, h, w = meta.shape
    if layout == "dense" and h == w == 1:
        return TensorMeta(meta.shape, contiguous_strides(meta.shape), meta.dtype, meta.device)  # type: ignore[arg-type]
    if layout == "channels_last" and c != 1 and h != 1 and w != 1:
        return TensorMeta(meta.shape, channels_last_strides(meta.shape), meta.dtype, meta.device)
    return None


def spatial_mean(line: KernelCall) -> bool:
    """A keepdim mean over H and W (dims 2 and 3) of its input, without a dtype."""
    args = dict(line.kwargs)
    dims = line.args[1] if len(line.args) > 1 else args.get("dim")
    keepdim = line.args[2] if len(line.args) > 2 else args.get("keepdim", False)
    dtype = line.args[3] if len(line.args) > 3 else args.get("dtype")
    return isinstance(dims, tuple) and set(dims) in SPATIAL and keepdim is True and dtype is None
