"""Fold zero padding into the convolutions that read it.

`convolution(constant_pad_nd(x, pad, 0), W, b, stride, padding, ...)` is `convolution(x, W, b, stride,
padding + p, ...)` when the pad adds the same `p >= 0` on both sides of each spatial dimension it
touches: a convolution's own padding is zeros on both sides. Models ported from TensorFlow pad
explicitly before every convolution (Hugging Face MobileNetV2's "SAME" padding: `F.pad(x, (0, 0, 0, 0))`
before each 1x1 convolution, `(1, 1, 1, 1)` before each 3x3 of stride 1); ATen's `constant_pad_nd`
writes a new tensor each time (fill the output, copy the input in), which this pass removes, and a
convolution that reads the unpadded value joins the oneDNN region (`onednn`) directly.

Asymmetric pads (`(0, 1, 0, 1)` before a 3x3 of stride 2 on an even size) stay: ATen's convolution
pads symmetrically. The pad's result must be read only as the input of non-transposed convolutions
(never returned), so every reader can take the unpadded value. Runs first, before `conv_bn`.

An empty pad (every amount 0: Swin pads each window partition to a multiple of the window, by
nothing at the usual sizes) is a copy; its readers read its source instead, where the two have one
layout, nothing returns the pad and nothing may write memory until its last reader.
"""

from __future__ import annotations

import math
from dataclasses import replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, Return, meta_table, substitute_line, uses
from opgen.runtime.passes.analysis import arg_value, readers, writes_between
from opgen.runtime.registry import KernelRegistry

PAD, CONV = "constant_pad_nd", "convolution"


def _symmetric_pad(line: Line, registry: KernelRegistry) -> tuple[str, tuple[int, ...]] | None:
    """(source, per-dimension padding, last dimension first) of a symmetric zero pad."""
    if not isinstance(line, KernelCall) or line.kernel != PAD or line.fallback or len(line.outputs) != 1:
        return None
    info = registry.by_name[PAD]
    source, pad, value = (arg_value(line, info, n) for n in ("self", "pad", "value"))
    if not isinstance(source, Ref) or not isinstance(pad, tuple) or len(pad) % 2:
        return None
    if not all(type(p) is int and p >= 0 for p in pad):  # negative pads crop; symbolic ones vary per call
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value != 0 or math.copysign(1, value) < 0:
        return None
    pairs = list(zip(pad[::2], pad[1::2], strict=True))
    if any(left != right for left, right in pairs):
        return None
    return source.name, tuple(left for left, _ in pairs)


def _padded(conv: Line | None, name: str, per_dim: tuple[int, ...], registry: KernelRegistry) -> KernelCall | None:
    """`conv` reading `name`'s source with `per_dim` added to its padding, if `name` is only its input."""
    if not isinstance(conv, KernelCall) or conv.kernel != CONV or conv.fallback:
        return None
    info = registry.by_name[CONV]
    positional = [a.name for a in info.args if not a.kwarg_only]
    at = positional.index("padding")
    padding = conv.args[at] if at < len(conv.args) else None
    if conv.args[:1] != (Ref(name),) or name in uses(replace(conv, args=conv.args[1:])):
        return None
    if arg_value(conv, info, "transposed") is not False or not isinstance(padding, tuple):
        return None
    widened = [p for p in padding if type(p) is int]
    if len(per_dim) > len(padding) or len(widened) != len(padding):
        return None
    for i, p in enumerate(per_dim):  # the pad's pairs run from the last dimension backwards
        widened[len(padding) - 1 - i] += p
    args: tuple[Arg, ...] = (*conv.args[:at], tuple(widened), *conv.args[at + 1 :])
    return replace(conv, args=args, target=f"{conv.target} with its input's zero pad folded")


def fold_pads(program: Program, registry: KernelRegistry) -> Program:
    if PAD not in registry.by_name:
        return program
    program = _drop_empty_pads(program, registry)
    if CONV not in registry.by_name:
        return program
    body: list[Line | None] = list(program.body)
    read_by = readers(program.body)  # folding rewrites readers in place: other pads' readers keep their places
    for i, line in enumerate(body):
        pad = _symmetric_pad(line, registry) if line is not None else None
        if pad is None:
            continue
        assert isinstance(line, KernelCall) and line.outputs[0] is not None
        name, (source, per_dim) = line.outputs[0].name, pad
        at = sorted(read_by.get(name, ()))
        folded = [_padded(body[j], name, per_dim, registry) for j in at]
        if not at or any(f is None for f in folded):
            continue
        for j, conv in zip(at, folded, strict=True):
            assert conv is not None
            body[j] = replace(conv, args=(Ref(source), *conv.args[1:]))
        body[i] = None
    return replace(program, body=tuple(line for line in body if line is not None))


def _drop_empty_pads(program: Program, registry: KernelRegistry) -> Program:
    """Each empty pad's readers read its source (see the module's doc)."""
    metas, read_by = meta_table(program), readers(program.body)
    info = registry.by_name[PAD]
    renamed: dict[str, Arg] = {}
    dropped: set[int] = set()
    for i, line in enumerate(program.body):
        if not isinstance(line, KernelCall) or line.kernel != PAD or line.fallback or len(line.outputs) != 1:
            continue
        source, pad, out = arg_value(line, info, "self"), arg_value(line, info, "pad"), line.outputs[0]
        if not isinstance(source, Ref) or not isinstance(pad, tuple) or any(p != 0 or type(p) is not int for p in pad):
            continue
        meta = metas.get(source.name)
        at = sorted(read_by.get(out.name, ())) if out is not None else []
        if out is None or meta is None or out.meta != meta or not at:
            continue
        if any(isinstance(program.body[j], Return) for j in at) or writes_between(program.body, i, at[-1] + 1):
            continue
        renamed[out.name] = renamed.get(source.name, source)
        dropped.add(i)
    if not dropped:
        return program
    body = tuple(substitute_line(line, renamed) for i, line in enumerate(program.body) if i not in dropped)
    return replace(program, body=body)
