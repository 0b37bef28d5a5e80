"""Layout: run 2-d max pooling in channels-last on CPU; the channels-last helpers the cudnn and onednn passes share.

ATen's CPU max pooling is an order of magnitude faster on channels-last input (it vectorises over
channels) than on contiguous NCHW input: on this kind of machine, 3x3/2 pooling of 64x112x112
takes about 6.5 ms contiguous and 0.3 ms channels-last. Copying the input to channels-last and the
(4x smaller) result back costs far less than the difference, so a pooling node whose indices are
unused becomes clone -> pool -> clone. The result is the same values in the same layout.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Program, Ref, Size, Sym, TensorMeta, Value, meta_table, uses
from opgen.runtime.ir.sizes import product
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.registry import KernelRegistry

POOL = "max_pool2d_with_indices"
MIN_CHANNELS = 8


def channels_last_strides(shape: tuple[Size, ...]) -> tuple[Size, ...]:
    _, c, h, w = shape
    return (product((h, w, c)), 1, product((w, c)), c)


def channels_last(meta: TensorMeta) -> TensorMeta:
    """The same 4-d tensor laid out channels-last."""
    return replace(meta, stride=channels_last_strides(meta.shape))


CONTIGUOUS = (("memory_format", Sym("memory_format", "contiguous_format")),)


def exit_copies(body: list[Line], region: dict[str, str], metas: dict[str, TensorMeta]) -> list[Line]:
    """Copy channels-last region values (`region`: name -> its channels-last name) back to their
    recorded layout, under their own names, where a line outside the region reads them."""
    original_of = {cl: name for name, cl in region.items()}
    outside = [line for line in body if not (isinstance(line, KernelCall) and _defines(line, original_of))]
    read_outside = {n for line in outside for n in uses(line)}
    out: list[Line] = []
    for line in body:
        out.append(line)
        for value in line.outputs if isinstance(line, KernelCall) else ():
            original = original_of.get(value.name) if value is not None else None
            if original is not None and original in read_outside:
                copy = Value(original, metas[original])
                out.append(KernelCall("clone", (Ref(value.name),), CONTIGUOUS, (copy,), line.node,
                                      "contiguous copy out of the channels-last region"))  # fmt: skip
    return out


def _defines(line: KernelCall, names: dict[str, str]) -> bool:
    return any(v is not None and v.name in names for v in line.outputs)


def _eligible(line: Line, metas: dict[str, TensorMeta]) -> bool:
    if not isinstance(line, KernelCall) or line.kernel != POOL or line.fallback or line.outputs[1:] != (None,):
        return False
    source = line.args[0]
    meta = metas.get(source.name) if isinstance(source, Ref) else None
    return (
        meta is not None
        and len(meta.shape) == 4
        and meta.device == "cpu"
        and meta.dtype in ("float32", "float64", "bfloat16")
        and meta.is_contiguous()
        and type(meta.shape[1]) is int
        and meta.shape[1] >= MIN_CHANNELS
    )


def channels_last_pooling(program: Program, registry: KernelRegistry) -> Program:
    if "clone" not in registry.by_name:
        return program
    metas, names = meta_table(program), fresh_namer(program, "buf")
    body: list[Line] = []
    for line in program.body:
        if not isinstance(line, KernelCall) or not _eligible(line, metas):
            body.append(line)
            continue
        source, out = line.args[0], line.outputs[0]
        assert isinstance(source, Ref) and out is not None and out.meta is not None
        src_meta = metas[source.name]
        cl_in = Value(next(names), channels_last(src_meta))
        cl_out = Value(next(names), channels_last(out.meta))
        to_cl = (("memory_format", Sym("memory_format", "channels_last")),)
        to_contiguous = (("memory_format", Sym("memory_format", "contiguous_format")),)
        body.append(KernelCall("clone", (source,), to_cl, (cl_in,), line.node, "channels-last input"))
        body.append(replace(line, args=(Ref(cl_in.name), *line.args[1:]), outputs=(cl_out, None)))
        body.append(KernelCall("clone", (Ref(cl_out.name),), to_contiguous, (out,), line.node, "contiguous result"))
    return replace(program, body=tuple(body))
