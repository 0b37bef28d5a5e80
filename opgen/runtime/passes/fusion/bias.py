"""Bias adds out of matrix products and convolutions on CUDA, into the fused kernel that reads them.

`addmm(b, x, W)` becomes `mm(x, W)` then `add(., b)`, and `convolution(x, W, b, ...)` becomes
`convolution(x, W, None, ...)` then `add(., b.view(C, 1, 1))`, where every reader of the result is a
node the fusion pass takes (pointwise or a row reduction): the add then joins their kernel and costs
nothing. An `addmm` read only through a reshape that keeps its last dimension (a linear layer on a
3-d or 4-d input) gets its add after the reshape, in the shape its readers use. A reader may also be
a permute whose readers fusion takes: the `lift_views` pass then moves it above the add.

Why: ATen adds a convolution's bias in a kernel of its own after cuDNN's (EfficientNet-B0: 81 adds,
202 us of its 1230 us on an H100), and a float32 `addmm` goes through cuBLASLt's bias epilogue,
which picks slower kernels than `mm` for ConvNeXt's shapes (about 900 us of products against
Inductor's 570 us for `mm`). Inductor does the same (`unfuse_bias_add_to_pointwise`, and its
convolution lowering keeps the bias out of the extern kernel).

Runs after `cudnn` (whose fused convolutions keep their bias: cuDNN adds it) and `gemv` (one-row
products are its kernels by then), right before `fusion`; CUDA, static sizes, float dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from opgen.runtime.ir import KernelCall, Line, Program, Ref, TensorMeta, Value, meta_table
from opgen.runtime.ir.fusible import PERMUTE, VIEW
from opgen.runtime.passes.analysis import RESHAPES, arg_value, constant_names, fresh_namer, readers, with_arg
from opgen.runtime.passes.fusion.steps import fusible
from opgen.runtime.registry import KernelRegistry

DTYPES = ("float32", "float16", "bfloat16")


def split_bias(program: Program, registry: KernelRegistry) -> Program:
    if not {"mm", "add", "view", "addmm", "convolution"} <= set(registry.by_name):
        return program
    metas = meta_table(program)
    constant = constant_names(program)
    read_by = readers(program.body)
    names = fresh_namer(program, "nobias")
    body: list[Line] = list(program.body)
    setup = list(program.setup)
    after: dict[int, list[KernelCall]] = {}  # body index -> adds placed right after that line

    def all_fusible(name: str) -> bool:
        """Every reader is a node fusion takes, or a permute of such nodes (`lift_views` moves it above the add)."""
        at = read_by.get(name, set())
        return bool(at) and all(fusible(body[i], registry, metas) or _permute_of(body[i], all_fusible) for i in at)

    for index, line in enumerate(program.body):
        if not isinstance(line, KernelCall) or line.fallback or line.mutates or len(line.outputs) != 1:
            continue
        out = line.outputs[0]
        meta = out.meta if out is not None else None
        if out is None or meta is None or not _eligible(meta):
            continue
        if line.target == "aten.addmm.default":
            bias = _addmm_bias(line, registry, metas, meta)
            if bias is None:
                continue
            raw = Value(next(names), meta)
            mm = KernelCall("mm", line.args[1:3], (), (raw,), line.node, "aten.mm.default")
            if all_fusible(out.name):
                body[index] = mm
                after[index] = [_add(raw, bias, out, line.node)]
                continue
            view = _only_reshape(out.name, meta.shape[-1], read_by, program.body)
            if view is None or not all_fusible(view[2].name):
                continue
            at, reshape, shaped = view
            raw_view = Value(next(names), shaped.meta)
            body[index] = mm
            body[at] = replace(reshape, args=(Ref(raw.name), *reshape.args[1:]), outputs=(raw_view,))
            after[at] = [_add(raw_view, bias, shaped, line.node)]
        elif line.kernel == "convolution":
            info = registry.by_name["convolution"]
            conv_bias = arg_value(line, info, "bias")
            if not isinstance(conv_bias, Ref) or conv_bias.name not in constant or not all_fusible(out.name):
                continue
            if not _per_channel(meta, metas[conv_bias.name]):
                continue
            column_meta = _column(metas[conv_bias.name], len(meta.shape))
            column = Value(next(names), column_meta)
            setup.append(KernelCall("view", (conv_bias, column_meta.shape), (), (column,), line.node, VIEW))
            raw = Value(next(names), meta)
            body[index] = replace(with_arg(line, info, "bias", None), outputs=(raw,))
            after[index] = [_add(raw, Ref(column.name), out, line.node)]
    if not after:
        return program
    placed: list[Line] = []
    for index, line in enumerate(body):
        placed.append(line)
        placed.extend(after.get(index, ()))
    return replace(program, setup=tuple(setup), body=tuple(placed))


def _permute_of(line: Line, fused: Callable[[str], bool]) -> bool:
    """A permute whose readers all fuse (ConvNeXt's `linear -> permute -> layer scale`)."""
    if not isinstance(line, KernelCall) or line.target != PERMUTE or len(line.outputs) != 1:
        return False
    out = line.outputs[0]
    return out is not None and fused(out.name)


def _eligible(meta: TensorMeta) -> bool:
    return meta.device.startswith("cuda") and meta.is_static and meta.dtype in DTYPES


def _addmm_bias(
    line: KernelCall, registry: KernelRegistry, metas: dict[str, TensorMeta], out: TensorMeta
) -> Ref | None:
    """The bias of `addmm(b, x, W)` with beta = alpha = 1 and b a vector over the output's columns."""
    info = registry.by_name["addmm"]
    if arg_value(line, info, "beta") != 1 or arg_value(line, info, "alpha") != 1 or len(line.args) < 3:
        return None
    bias = line.args[0]
    meta = metas.get(bias.name) if isinstance(bias, Ref) else None
    if meta is None or meta.dtype != out.dtype or meta.shape not in ((out.shape[-1],), (1, out.shape[-1])):
        return None
    return bias  # type: ignore[return-value]


def _only_reshape(
    name: str, columns: object, read_by: dict[str, set[int]], body: tuple[Line, ...]
) -> tuple[int, KernelCall, Value] | None:
    """(where, the call, its result): the reshape that is the value's only reader, where it keeps the
    last dimension (a bias over the columns stays a bias over the last dimension)."""
    at = read_by.get(name, set())
    if len(at) != 1:
        return None
    (index,) = at
    line = body[index]
    if not isinstance(line, KernelCall) or line.target not in RESHAPES or len(line.outputs) != 1:
        return None
    out = line.outputs[0]
    meta = out.meta if out is not None else None
    if out is None or meta is None or not _eligible(meta) or not line.args or line.args[0] != Ref(name):
        return None
    return (index, line, out) if meta.shape[-1] == columns else None


def _per_channel(out: TensorMeta, bias: TensorMeta) -> bool:
    """The convolution's bias is one value per output channel, of the output's dtype."""
    return len(out.shape) >= 3 and bias.shape == (out.shape[1],) and bias.dtype == out.dtype


def _column(bias: TensorMeta, rank: int) -> TensorMeta:
    """The bias viewed as (C, 1, ...): it broadcasts over a convolution's output of `rank` dimensions."""
    shape = (bias.shape[0], *(1,) * (rank - 2))
    return replace(bias, shape=shape, stride=(bias.stride[0], *(1,) * (rank - 2)))


def _add(raw: Value, bias: Ref, out: Value, node: str) -> KernelCall:
    return KernelCall("add", (Ref(raw.name), bias), (), (out,), f"{node}_bias", "aten.add.Tensor")
