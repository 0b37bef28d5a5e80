"""Fold eval-mode batch norm into the convolution feeding it.

`bn(conv(x, W, b))` with constant W, b and constant batch-norm statistics is `conv(x, W', b')`
with `scale = gamma / sqrt(var + eps)`, `W' = W * scale[:, None, ...]` and
`b' = (b - mean) * scale + beta`. The fold is written as setup lines (kernel calls on the
constants), so it runs once when the program is bound and the compiled artifact never stores
derived tensors: it stays valid for any weights of the same shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, TensorMeta, Value, meta_table
from opgen.runtime.passes.analysis import arg_value, constant_names, fresh_namer, use_counts
from opgen.runtime.registry import KernelRegistry

CONV, BATCH_NORM = "convolution", "_native_batch_norm_legit_no_training"
_KERNELS = ("add_scalar", "rsqrt", "mul", "view", "sub", "neg", "add")
_FOLDABLE_DTYPES = ("float32", "float64")


@dataclass(frozen=True, slots=True)
class _Match:
    conv_index: int
    weight: str
    bias: str | None
    gamma: str | None
    beta: str | None
    mean: str
    var: str
    eps: float


def _name(arg: Arg) -> str | None:
    return arg.name if isinstance(arg, Ref) else None


def _match(
    body: list[Line | None], bn_index: int, producers: dict[str, int], program: Program, registry: KernelRegistry
) -> _Match | None:
    bn = body[bn_index]
    if not isinstance(bn, KernelCall) or bn.kernel != BATCH_NORM or bn.fallback or any(bn.outputs[1:]):
        return None
    bn_info, conv_info = registry.by_name[BATCH_NORM], registry.by_name[CONV]
    source = _name(arg_value(bn, bn_info, "input"))
    conv_index = producers.get(source or "", -1)
    conv = body[conv_index] if conv_index >= 0 else None
    if not isinstance(conv, KernelCall) or conv.kernel != CONV or use_counts(body)[source or ""] != 1:
        return None
    if arg_value(conv, conv_info, "transposed") is not False:
        return None
    names = {a: _name(arg_value(bn, bn_info, a)) for a in ("weight", "bias", "running_mean", "running_var")}
    weight, bias = _name(arg_value(conv, conv_info, "weight")), _name(arg_value(conv, conv_info, "bias"))
    constant, metas = constant_names(program), meta_table(program)
    needed = [weight, bias, *names.values()]
    if weight is None or names["running_mean"] is None or names["running_var"] is None:
        return None
    if not all(n is None or n in constant for n in needed):
        return None
    if {metas[n].dtype for n in needed if n is not None} - set(_FOLDABLE_DTYPES):
        return None
    eps = arg_value(bn, bn_info, "eps")
    assert isinstance(eps, float | int)
    return _Match(
        conv_index,
        weight,
        bias,
        names["weight"],
        names["bias"],
        names["running_mean"],
        names["running_var"],
        float(eps),
    )


def _fold_lines(
    m: _Match, metas: dict[str, TensorMeta], names: Iterator[str], node: str
) -> tuple[list[Line], str, str]:
    w_meta = metas[m.weight]
    vec = TensorMeta((w_meta.shape[0],), (1,), w_meta.dtype, w_meta.device)
    lines: list[Line] = []

    def call(kernel: str, args: tuple[Arg, ...], meta: TensorMeta) -> str:
        name = next(names)
        lines.append(KernelCall(kernel, args, (), (Value(name, meta),), node, f"fold batch norm: {kernel}"))
        return name

    scale = call("rsqrt", (Ref(call("add_scalar", (Ref(m.var), m.eps), vec)),), vec)
    if m.gamma is not None:
        scale = call("mul", (Ref(m.gamma), Ref(scale)), vec)
    column = (w_meta.shape[0],) + (1,) * (len(w_meta.shape) - 1)
    weight = call(
        "mul",
        (Ref(m.weight), Ref(call("view", (Ref(scale), column), vec.with_shape(column)))),
        w_meta.with_shape(w_meta.shape),
    )
    if m.bias is not None:
        bias = call("mul", (Ref(call("sub", (Ref(m.bias), Ref(m.mean)), vec)), Ref(scale)), vec)
        if m.beta is not None:
            bias = call("add", (Ref(bias), Ref(m.beta)), vec)
    else:
        shift = call("mul", (Ref(m.mean), Ref(scale)), vec)
        bias = call("sub", (Ref(m.beta), Ref(shift)), vec) if m.beta is not None else call("neg", (Ref(shift),), vec)
    return lines, weight, bias


def fold_conv_bn(program: Program, registry: KernelRegistry) -> Program:
    if any(k not in registry.by_name for k in (CONV, BATCH_NORM, *_KERNELS)):
        return program
    body: list[Line | None] = list(program.body)
    setup = list(program.setup)
    names, metas = fresh_namer(program, "fold"), meta_table(program)
    for i in range(len(body)):
        candidate = body[i]
        if not isinstance(candidate, KernelCall) or candidate.kernel != BATCH_NORM:
            continue  # the scan below is over the whole body: only for a batch norm (a transformer has none)
        producers = {
            v.name: j for j, line in enumerate(body) if isinstance(line, KernelCall) for v in line.outputs if v
        }
        m = _match(body, i, producers, replace(program, setup=tuple(setup)), registry)
        if m is None:
            continue
        conv, bn = body[m.conv_index], body[i]
        assert isinstance(conv, KernelCall) and isinstance(bn, KernelCall)
        lines, weight, bias = _fold_lines(m, metas, names, f"{conv.node} + {bn.node}")
        setup += lines
        args = (conv.args[0], Ref(weight), Ref(bias), *conv.args[3:])
        target = f"{conv.target} with {bn.node} folded"
        body[m.conv_index] = replace(
            conv, args=args, outputs=bn.outputs[:1], node=f"{conv.node}+{bn.node}", target=target
        )
        body[i] = None
    return replace(program, setup=tuple(setup), body=tuple(line for line in body if line is not None))
