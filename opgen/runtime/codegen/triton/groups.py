"""The Triton kernel of a fusion group: one `FusedGroup` (`passes.fusion.groups`) -> one @triton.jit kernel.

Sizes and strides are fixed (fusion runs on static shapes), so they are literals in the source and
Triton folds the index arithmetic; tensors are the only parameters, named after the graph's values.

- A pointwise kernel walks the flattened iteration space in blocks of BLOCK elements. A cat selects,
  per element, the operand whose range of the joined dimension holds it; each operand is loaded (or
  computed, by the steps the cat absorbed) at its own index, under a mask for its range.
- A row kernel takes BLOCK_R rows of the iteration space per program, each whole (BLOCK_N >= the
  row length), so reductions over the last dimension are a `tl.sum`/`tl.max` over axis 1, and
  their results, one per row ([BLOCK_R, 1]), broadcast back along the row.

Every load computes an address from the tensor's own strides against the iteration space (a
broadcast dimension has stride 0 there), so strided, expanded and channels-last operands need no
copy; an operand that is contiguous in the iteration order is read with the running offset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opgen.runtime.codegen.triton.module import Kernel, jit_module, next_power_of_2
from opgen.runtime.codegen.triton.ops import TL, Operand, cast, compute_type, pointwise
from opgen.runtime.codegen.triton.order import in_memory_order
from opgen.runtime.codegen.triton.placement import Index, placed_address
from opgen.runtime.ir import Config, FusedGroup, Ref, Step, Tensor, contiguous_strides, flat_steps
from opgen.runtime.ir.fusible import CAT, row_fits


class CodegenError(Exception):
    """A node the printer cannot express. The fusion pass leaves such groups to ATen before they get
    here (`passes.fusion.expressible`, by the same rules): one that does is a bug."""


def kernel(group: FusedGroup) -> Kernel:
    """The group's kernel. Its source names no graph value or node (parameters `in0..`, `out0..`, the
    kernel `fused_<hash of the body>`), so groups that compute the same thing on the same sizes, as a
    model's layers do, share one source: one compile and one tuning. The report names the nodes."""
    group = in_memory_order(group)
    body = group_body(group)
    meta = "BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr" if group.kind == "row" else "BLOCK: tl.constexpr"
    text = "\n".join(
        [f"    # {group.describe()}", *(f"    {line}" for line in (*program_elements(group), *body.lines))]
    )
    name, source = jit_module("fused", group_params(group), meta, text)
    return Kernel(name, source, _configs(group))


def group_body(group: FusedGroup, stored: Sequence[Tensor] | None = None) -> GroupBody:
    """The code of the group's steps, then the stores of `stored` (default: every output)."""
    body = GroupBody(group)
    for step in group.steps:
        body.step(step)
    for out in group.outputs if stored is None else stored:
        body.store(out)
    return body


def _names(group: FusedGroup) -> list[str]:
    return [t.name for t in (*group.inputs, *group.outputs)]


def group_params(group: FusedGroup) -> list[str]:
    """The kernel's parameters: `in0..` for the inputs, `out0..` for the outputs (no graph names)."""
    return [f"in{i}" for i in range(len(group.inputs))] + [f"out{i}" for i in range(len(group.outputs))]


def program_elements(group: FusedGroup, pid: str = "tl.program_id(0)") -> list[str]:
    """Where the program's elements are: its rows (`pid` the program's block of rows), or its block."""
    if group.kind == "row":
        rows, n = math.prod(group.shape[:-1]), group.shape[-1]
        return [
            f"rows = {pid} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            "cols = tl.arange(0, BLOCK_N)[None, :]",
            f"rmask = rows < {rows}",
            f"cmask = cols < {n}",
            "mask = rmask & cmask",
        ]
    return [
        f"offs = {pid} * BLOCK + tl.arange(0, BLOCK)",
        f"mask = offs < {math.prod(group.shape)}",
    ]


@dataclass(frozen=True, slots=True)
class _Space:
    """Where a pointwise kernel's values are: the shape indexed, its flat index and the mask of valid
    elements. The kernel's own is its group's shape at `offs`; a cat's operand has its own, in its range."""

    shape: tuple[int, ...]
    index: str = "offs"
    mask: str = "mask"


@dataclass
class GroupBody:
    group: FusedGroup
    lines: list[str] = field(default_factory=list)
    values: dict[str, Operand] = field(default_factory=dict)  # graph value -> its Operand in `space`
    count: int = 0
    space: _Space = field(init=False)
    tensors: dict[str, Tensor] = field(init=False)  # every tensor the group reads or defines
    params: dict[str, str] = field(init=False)  # each input and output -> the kernel's parameter for it

    def __post_init__(self) -> None:
        steps = flat_steps(self.group.steps)
        tensors = [*self.group.inputs, *(t for s in steps for t in s.outputs if t is not None)]
        self.space = _Space(self.group.shape)
        self.tensors = {t.name: t for t in tensors}
        self.params = dict(zip(_names(self.group), group_params(self.group), strict=True))

    @contextmanager
    def within(self, space: _Space) -> Iterator[None]:
        """Emit in another index space (a cat's operand range), with values of its own."""
        outer = self.space, self.values
        self.space, self.values = space, {}
        try:
            yield
        finally:
            self.space, self.values = outer

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def let(self, text: str, ctype: str) -> Operand:
        name = self.fresh()
        self.lines.append(f"{name} = {text}")
        return Operand(name, ctype)

    def operand(self, name: str) -> Operand:
        if name not in self.values:  # an input: loaded on first use
            tensor = self.tensors[name]  # an input (a value the group defines is in `values` already)
            address, where = _address(self.group, tensor, space=self.space)
            mask = f", mask={where}" if where else ""
            ctype = compute_type(tensor.meta.dtype)
            param = self.params[name]
            load = f"tl.load({param} + {address}{mask})" if address else f"tl.load({param})"
            same = ctype == tensor.meta.dtype  # bool loads as int1, which compute_type also calls bool
            self.values[name] = self.let(load if same else f"{load}.to({TL[ctype]})", ctype)
        return self.values[name]

    def arguments(self, step: Step) -> dict[str, Any]:
        return {k: self.operand(v.name) if isinstance(v, Ref) else v for k, v in step.values}

    def step(self, step: Step) -> None:
        self.lines.append(f"# {step.target}")
        values = self.arguments(step) if step.target != CAT else {}
        outs = [t for t in step.outputs if t is not None]
        if step.target == CAT:
            self.values[outs[0].name] = _cat(self, step)
            return
        if step.target in _ROWS:
            results = _ROWS[step.target](self, values, step)
            for t, value in zip(step.outputs, results, strict=False):
                if t is not None:
                    self.values[t.name] = value
            return
        out = outs[0]
        text = pointwise(step.target, values, out.meta.dtype)
        if text is None:
            raise CodegenError(f"node '{step.node}' ({step.target}): no Triton expression for these arguments")
        ctype = compute_type(out.meta.dtype)
        if step.target == "aten._to_copy.default":
            text = self.cast_text(step, out.meta.dtype)
        same = next((v for v in self.values.values() if v.text == text and v.ctype == ctype), None)
        self.values[out.name] = same or self.let(text, ctype)  # a no-op (clone, same-type cast) names no new value

    def cast_text(self, step: Step, dtype: str) -> str:
        """An explicit cast rounds: a half value held in float32 to its own dtype first, then to `dtype`."""
        source = dict(step.values)["self"]
        assert isinstance(source, Ref)
        value, held = self.values[source.name], self.tensors[source.name].meta.dtype
        text = value.text
        loaded = any(t.name == source.name for t in self.group.inputs)  # a load holds its dtype exactly
        if held in ("float16", "bfloat16") and dtype != held and not loaded:
            text = f"{text}.to({TL[held]}).to(tl.float32)"
        if dtype in ("float16", "bfloat16"):
            return f"{text}.to({TL[dtype]}).to(tl.float32)"
        return cast(Operand(text, value.ctype), compute_type(dtype))

    def store(self, tensor: Tensor) -> None:
        if tensor.placement is not None:  # the group's value, where a chain of data movements puts it
            address, where = placed_address(_start(self.group), tensor.placement, tensor.meta), "mask"
        else:
            address, where = _address(self.group, tensor, output=True)
        mask = f", mask={where}" if where else ""
        self.lines.append(f"tl.store({self.params[tensor.name]} + {address}, {self.stored(tensor)}{mask})")

    def stored(self, tensor: Tensor) -> str:
        """The output's value as it is stored: in its dtype."""
        value = self.values[tensor.placement.source if tensor.placement is not None else tensor.name]
        dtype = tensor.meta.dtype
        if dtype in ("float16", "bfloat16"):
            return f"{value.text}.to({TL[dtype]})"
        return cast(value, dtype) if value.ctype != dtype else value.text


def _address(group: FusedGroup, tensor: Tensor, output: bool = False, space: _Space | None = None) -> tuple[str, str]:
    """(offset expression, mask) of the tensor's element at the current index (of `space`, in a pointwise
    kernel: by default the group's own); "" for none."""
    space = space or _Space(group.shape)
    shape = space.shape
    meta = tensor.meta
    # Right-align the tensor's dims with the iteration space; a broadcast dim reads stride 0. A row
    # kernel's reduction without keepdim (shape S[:-1]) is the exception: one value per row.
    own = [0 if n == 1 else s for n, s in zip(meta.shape, meta.stride, strict=True)]
    if group.kind == "row" and output and meta.shape == shape[:-1]:
        own.append(0)
    strides = [0] * (len(shape) - len(own)) + own
    # No storage offset: the kernel is handed the view itself, whose pointer already points at its first
    # element (a fresh output has none).
    if group.kind == "row":
        lead = _linear(shape[:-1], strides[:-1], "rows")
        col = "cols" if strides[-1] == 1 else f"cols * {strides[-1]}" if strides[-1] else ""
        if output:  # a store's address has its value's shape: full rows, or one value per row
            full = meta.shape == shape
            lead, col = lead or "rows * 0", (col or "cols * 0") if full else ""
        parts = [p for p in (lead, col) if p]
        where = {(True, True): "mask", (True, False): "rmask", (False, True): "cmask"}.get((bool(lead), bool(col)), "")
    else:
        parts = [p for p in (_linear(shape, strides, space.index) or (f"{space.index} * 0" if output else ""),) if p]
        where = space.mask if parts else ""
    return " + ".join(parts), where


def _start(group: FusedGroup) -> Index:
    """The current element of the iteration space: the flat index, or a row kernel's row and column."""
    if group.kind != "row":
        return Index(group.shape, linear="offs")
    lead = Index(group.shape[:-1], linear="rows").coordinates() if len(group.shape) > 1 else ()
    return Index(group.shape, linear=f"rows * {group.shape[-1]} + cols", coords=(*lead, "cols"))


def _linear(shape: tuple[int, ...], strides: list[int], index: str) -> str:
    """sum(i_d * stride_d) for the row-major index `index` over `shape`; "" if every stride is 0."""
    live = [(d, s) for d, (n, s) in enumerate(zip(shape, strides, strict=True)) if n != 1 and s != 0]
    if not live:
        return ""
    dense = contiguous_strides(shape)
    scale = live[0][1] // dense[live[0][0]] if live[0][1] % dense[live[0][0]] == 0 else 0
    if scale and len(live) == sum(1 for n in shape if n != 1) and all(s == scale * dense[d] for d, s in live):
        return index if scale == 1 else f"{index} * {scale}"  # dense in iteration order (times a step)
    terms = []
    for d, s in live:
        inner = math.prod(shape[d + 1 :])
        i = index if inner == 1 else f"{index} // {inner}"
        if any(n != 1 for n in shape[:d]):  # an outer dim exists: wrap around this one
            i = f"{i} % {shape[d]}" if inner == 1 else f"({i}) % {shape[d]}"
        terms.append(i if s == 1 else f"({i}) * {s}" if " " in i else f"{i} * {s}")
    return " + ".join(terms)


def _cat(body: GroupBody, step: Step) -> Operand:
    """The concatenation at the current index: each operand evaluated in its own range of the joined
    dimension (its index shifted into the operand, its loads masked to the range), then selected."""
    if body.group.kind != "pointwise" or body.space.index != "offs":
        raise CodegenError(f"node '{step.node}': a cat only fuses at the top of a pointwise kernel")
    values = dict(step.values)
    operands = [r for r in values["tensors"] if isinstance(r, Ref)]
    out = next(t for t in step.outputs if t is not None)
    shape = body.group.shape
    dim = values.get("dim", 0) % len(shape)
    inner, size = math.prod(shape[dim + 1 :]), shape[dim]
    outer = math.prod(shape[:dim])
    ctype = compute_type(out.meta.dtype)
    at = body.let(_div_mod("offs", inner, size), "int32")  # the element's position along `dim`
    branches = step.branches or ((),) * len(operands)
    picked: list[tuple[int, Operand]] = []
    start = 0
    for ref, steps in zip(operands, branches, strict=True):
        width = body.tensors[ref.name].meta.shape[dim]
        end = start + width
        along = f"({at.text} - {start})" if start else at.text
        index = [f"{along} * {inner}" if inner != 1 else along]
        if outer != 1:
            index.insert(0, f"(offs // {size * inner}) * {width * inner}")
        if inner != 1:
            index.append(f"offs % {inner}")
        bounds = [f"({at.text} >= {start})" if start else "", f"({at.text} < {end})" if end < size else ""]
        where = body.let(" & ".join(["mask", *filter(None, bounds)]), "bool")
        own = body.let(" + ".join(index), "int32")
        with body.within(_Space((*shape[:dim], width, *shape[dim + 1 :]), own.text, where.text)):
            for inner_step in steps:
                body.step(inner_step)
            picked.append((end, body.operand(ref.name)))
        start = end
    text = cast(picked[-1][1], ctype)
    for end, value in reversed(picked[:-1]):
        text = f"tl.where({at.text} < {end}, {cast(value, ctype)}, {text})"
    return body.let(text, ctype)


def _div_mod(index: str, inner: int, size: int) -> str:
    """`(index // inner) % size`, without the parts that do nothing."""
    text = index if inner == 1 else f"({index} // {inner})"
    return f"{text} % {size}"


# ---- row reductions: each returns the Operands of the node's outputs ----


def _full(x: Operand, identity: str) -> str:
    return f"tl.where(mask, {x.text}, {identity})"


def _softmax(body: GroupBody, values: Mapping[str, Any], step: Step, log: bool = False) -> list[Operand]:
    x = values["self"]
    ctype = compute_type(next(t for t in step.outputs if t is not None).meta.dtype)
    x = Operand(cast(x, ctype), ctype)
    minus_inf = 'float("-inf")'
    m = body.let(f"tl.max({_full(x, minus_inf)}, axis=1, keep_dims=True)", ctype)
    shifted = body.let(f"{x.text} - {m.text}", ctype)
    e = body.let(f"tl.exp({shifted.text})", ctype)
    s = body.let(f"tl.sum(tl.where(mask, {e.text}, 0.0), axis=1, keep_dims=True)", ctype)
    if log:
        return [body.let(f"{shifted.text} - tl.log({s.text})", ctype)]
    return [body.let(f"{e.text} / {s.text}", ctype)]


def _layer_norm(body: GroupBody, values: Mapping[str, Any], step: Step) -> list[Operand]:
    n = body.group.shape[-1]
    x = values["input"]
    x = Operand(cast(x, "float32"), "float32") if x.ctype != "float64" else x
    ctype = x.ctype
    mean = body.let(f"tl.sum({_full(x, '0.0')}, axis=1, keep_dims=True) / {n}", ctype)
    centered = body.let(f"tl.where(mask, {x.text} - {mean.text}, 0.0)", ctype)
    var = body.let(f"tl.sum({centered.text} * {centered.text}, axis=1, keep_dims=True) / {n}", ctype)
    rstd = body.let(f"tl.rsqrt({var.text} + {float(values['eps'])!r})", ctype)
    y = f"{centered.text} * {rstd.text}"
    if isinstance(values.get("weight"), Operand):
        y = f"{y} * {cast(values['weight'], ctype)}"
    if isinstance(values.get("bias"), Operand):
        y = f"{y} + {cast(values['bias'], ctype)}"
    return [body.let(y, ctype), mean, rstd]


def _reduce(kind: str) -> Any:
    def emit(body: GroupBody, values: Mapping[str, Any], step: Step) -> list[Operand]:
        out = next(t for t in step.outputs if t is not None)
        ctype = compute_type(out.meta.dtype)
        x = Operand(cast(values["self"], ctype), ctype)
        if kind in ("max", "min"):
            if not row_fits(step.target, ctype):
                raise CodegenError(f"node '{step.node}': amax/amin of {out.meta.dtype} is left to ATen")
            identity = 'float("-inf")' if kind == "max" else 'float("inf")'
            return [body.let(f"tl.{kind}({_full(x, identity)}, axis=1, keep_dims=True)", ctype)]
        total = f"tl.sum({_full(x, '0')}, axis=1, keep_dims=True)"
        if kind == "mean":
            total = f"{total} / {body.group.shape[-1]}"
        return [body.let(total, ctype)]

    return emit


_ROWS = {
    "aten._softmax.default": _softmax,
    "aten._log_softmax.default": lambda body, values, step: _softmax(body, values, step, log=True),
    "aten.native_layer_norm.default": _layer_norm,
    "aten.sum.dim_IntList": _reduce("sum"),
    "aten.mean.dim": _reduce("mean"),
    "aten.amax.default": _reduce("max"),
    "aten.amin.default": _reduce("min"),
}


def row_configs(groups: Sequence[FusedGroup]) -> list[Config]:
    """Row tiles for row groups launched together (one group: its own kernel; several: `horizontal`'s): BLOCK_N
    the longest row's power of two, BLOCK_R rows a program up to a tile of 8192, the three largest tiles that
    fit (small rows want several per program); the grid each group's blocks of rows, one after another."""
    block_n = max(16, *(next_power_of_2(g.shape[-1]) for g in groups))
    rows = [math.prod(g.shape[:-1]) for g in groups]
    configs: list[Config] = []
    for block_r in (1, 2, 4, 8, 16, 32):
        tile = block_r * block_n
        if block_r > 1 and (tile > 8192 or block_r > next_power_of_2(max(rows))):
            continue
        warps = 1 if tile <= 256 else 2 if tile <= 1024 else 4 if tile <= 4096 else 8
        grid = (sum(-(-r // block_r) for r in rows),)
        configs.append(((("BLOCK_N", block_n), ("BLOCK_R", block_r)), warps, 1, grid))
    return configs[-3:]


def _configs(group: FusedGroup) -> tuple[Config, ...]:
    """Candidates the first call autotunes over, with their (fixed) grids."""
    if group.kind == "row":
        return tuple((meta, warps, stages, (*grid, 1, 1)) for meta, warps, stages, grid in row_configs([group]))
    numel = math.prod(group.shape)
    configs = []
    for block, warps in ((256, 2), (1024, 4), (2048, 8)):
        if block > 256 and block // 2 >= numel:
            continue
        configs.append(((("BLOCK", block),), warps, 1, (-(-numel // block), 1, 1)))
    return tuple(configs)
