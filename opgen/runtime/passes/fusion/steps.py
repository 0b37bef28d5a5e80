"""Which graph nodes fusion can take, one at a time: the `Step` a fusible call becomes (a pointwise
node, a row reduction over the last dimension, a concatenation; `opgen.runtime.ir.plans`), by the
rules of `opgen.runtime.ir.fusible`. `opgen.runtime.passes.fusion.groups` then decides which steps run
together.
"""

from __future__ import annotations

from opgen.runtime.ir import KernelCall, Line, Ref, Step, Tensor, TensorMeta, refs
from opgen.runtime.ir.fusible import CAT, DTYPES, POINTWISE, ROW_OPS
from opgen.runtime.registry import BindError, KernelRegistry, bind

MAX_ROW = 8192  # longest row a row kernel holds in registers (float32)


def device_of(step: Step) -> str:
    return next(t.meta.device for t in step.outputs if t is not None)


def out_shape(step: Step) -> tuple[int, ...]:
    first = next(t for t in step.outputs if t is not None)
    return first.meta.shape  # type: ignore[return-value]


def reduced_input(step: Step, metas: dict[str, TensorMeta]) -> TensorMeta:
    source = dict(step.values)["input" if step.target == "aten.native_layer_norm.default" else "self"]
    assert isinstance(source, Ref)
    return metas[source.name]


def fusible(line: Line, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> bool:
    """Whether the fusion pass would take `line` into a group (a pointwise node or a row reduction)."""
    return isinstance(line, KernelCall) and step_of(line, registry, metas) is not None


def step_of(line: KernelCall, registry: KernelRegistry, metas: dict[str, TensorMeta]) -> Step | None:
    """The node as a fusible step, or None where it must stay an ATen kernel."""
    if line.fallback or line.jit or line.mutates or not line.outputs:
        return None
    info = registry.by_name.get(line.kernel)
    if info is None or info.variant != "functional":
        return None
    target = _target(line.target, info.aten)
    if target not in POINTWISE and target not in ROW_OPS and target != CAT:
        return None
    try:
        values = bind(info, line.args, dict(line.kwargs))
    except BindError:
        return None
    outputs = tuple(None if v is None or v.meta is None else Tensor(v.name, v.meta) for v in line.outputs)
    tensors = [t.meta for t in outputs if t is not None]
    for value in refs(tuple(values.values())):
        meta = metas.get(value)
        if meta is None:
            return None  # a non-tensor value by name (a folded shape list): not ours
        tensors.append(meta)
    if not tensors or any(t is None for t in outputs[:1]):
        return None
    devices = {m.device for m in tensors}
    if len(devices) != 1 or not next(iter(devices)).startswith("cuda"):
        return None
    if any(not m.is_static or m.dtype not in DTYPES or m.span >= 2**31 for m in tensors):
        return None  # symbolic sizes, odd dtypes, or offsets past int32 indexing
    step = Step(line.node, target, tuple(values.items()), outputs)
    if target in ROW_OPS and not _row_op_fits(step, metas):
        return None
    if target == CAT and cat_dim(step, metas) is None:
        return None
    return step


def _target(target: str, aten: str) -> str:
    """The overload a call runs: its graph node's, or for a call a pass made (a layout copy out of a
    channels-last region, whose target says why it is there) the one its kernel binds."""
    if target in POINTWISE or target in ROW_OPS or target == CAT:
        return target
    name = aten.removeprefix("aten::")
    return f"aten.{name}" if "." in name else f"aten.{name}.default"


def cat_dim(step: Step, metas: dict[str, TensorMeta]) -> int | None:
    """The dimension a cat joins its operands along, or None where it is not a plain concatenation of
    tensors of the output's rank (ATen also skips legacy empty 1-d operands: not ours)."""
    values = dict(step.values)
    operands = values["tensors"]
    out = out_shape(step)
    dim = values.get("dim", 0)
    if not isinstance(operands, tuple) or not operands or not isinstance(dim, int) or not -len(out) <= dim < len(out):
        return None
    dim %= len(out)
    shapes = [metas[r.name].shape for r in operands if isinstance(r, Ref)]
    if len(shapes) != len(operands) or any(len(s) != len(out) for s in shapes):
        return None
    if any(s[:dim] != out[:dim] or s[dim + 1 :] != out[dim + 1 :] or s[dim] == 0 for s in shapes):
        return None
    return dim if sum(s[dim] for s in shapes) == out[dim] else None


def _row_op_fits(step: Step, metas: dict[str, TensorMeta]) -> bool:
    """A reduction over exactly the last dimension, of a row short enough for registers."""
    values = dict(step.values)
    source = reduced_input(step, metas)
    rank = len(source.shape)
    if rank == 0 or not 1 <= source.shape[-1] <= MAX_ROW:  # type: ignore[operator]
        return False
    if step.target == "aten.native_layer_norm.default":
        shape = values["normalized_shape"]
        return isinstance(shape, tuple) and list(shape) == [source.shape[-1]]
    dims = values[ROW_OPS[step.target]]
    dims = dims if isinstance(dims, tuple) else (dims,)
    if len(dims) != 1 or not isinstance(dims[0], int) or dims[0] not in (-1, rank - 1):
        return False
    if step.target in ("aten.sum.dim_IntList", "aten.mean.dim") and values.get("dtype") is not None:
        return False
    if step.target in ("aten._softmax.default", "aten._log_softmax.default") and values.get("half_to_float"):
        return False
    return True
