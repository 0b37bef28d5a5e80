"""The wrapper IR: a compiled graph as a list of small frozen lines of plain data.

A `Program` (`opgen.runtime.ir.program`) holds these lines: `setup` lines that run once when the
executor binds the program, `memo` lines that run when the size symbols they read change and `body`
lines that run on every call. Lines refer to values by name (`Ref`); every value a
line defines is a `Value` carrying its `TensorMeta` where known. Nothing here imports torch or
refers to a graph, so programs can be built by hand, transformed by passes and printed by a
backend in tests.

Sizes may be symbolic (dynamic shapes): a `SizeExpr` is Python source over named size symbols
(`s27*s77`), bound once per call from the inputs' sizes by `SizeLet` lines at the top of the body.
Metas hold ints or `SizeExpr`s; `opgen.runtime.ir.sizes` does arithmetic on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Union

from opgen.runtime.ir.sizes import Size, SizeExpr
from opgen.runtime.ir.sizes import contiguous_strides as symbolic_strides

# Bytes per element of the dtypes the runtime plans memory for (others are never planned).
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to a named value: an input, a constant or a value a line defined."""

    name: str


@dataclass(frozen=True, slots=True)
class Sym:
    """A non-literal Python value printed by name: a dtype, device, layout, memory format or inf/nan."""

    kind: str  # "dtype" | "device" | "layout" | "memory_format" | "float"
    value: str  # "float32", "cpu", "strided", "channels_last", "-inf"


# An argument: a reference, a symbol, a Python literal, or a tuple of arguments (lists print as tuples).
Arg = Union[Ref, Sym, SizeExpr, int, float, bool, str, None, tuple["Arg", ...]]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class TensorMeta:
    shape: tuple[Size, ...]
    stride: tuple[Size, ...]
    dtype: str
    device: str
    offset: Size = 0

    @property
    def is_static(self) -> bool:
        """No symbolic size, stride or offset: `numel`, `span` and `is_contiguous` are exact numbers."""
        return all(type(n) is int for n in (*self.shape, *self.stride, self.offset))

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for n in (*self.shape, *self.stride, self.offset) for s in size_symbols(n)))

    @property
    def numel(self) -> int:
        """Elements (static metas only: callers check `is_static`)."""
        assert self.is_static, f"numel of a symbolic meta {self.shape}"
        return math.prod(self.shape)  # type: ignore[arg-type]

    @property
    def span(self) -> int:
        """Elements of storage the tensor reaches, from element 0 of its storage (static metas only)."""
        if self.numel == 0:
            return self.offset  # type: ignore[return-value]
        span = sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True))  # type: ignore[operator]
        return self.offset + 1 + span  # type: ignore[operator,no-any-return]

    def is_contiguous(self) -> bool:
        """Row-major dense, as torch.Tensor.is_contiguous (strides of size-1 dims do not matter).

        With symbolic sizes: True only where the strides are provably the row-major ones.
        """
        if not self.is_static:
            expected = symbolic_strides(self.shape)
            return self.offset == 0 and all(
                n == 1 or s == e for n, s, e in zip(self.shape, self.stride, expected, strict=True)
            )
        expected = contiguous_strides(self.shape)  # type: ignore[arg-type]
        return self.numel <= 1 or all(
            n == 1 or s == e for n, s, e in zip(self.shape, self.stride, expected, strict=True)
        )

    def same_layout(self, other: TensorMeta) -> bool:
        """The same elements at the same places: equal but for strides of size-1 dims, which address nothing
        (a slice of a buffer, cloned, keeps its leading stride; a fresh tensor of its shape has its own)."""
        return (
            (self.shape, self.dtype, self.device, self.offset) == (other.shape, other.dtype, other.device, other.offset)
            and all(n == 1 or a == b for n, a, b in zip(self.shape, self.stride, other.stride, strict=True))
        )  # fmt: skip

    def with_shape(self, shape: tuple[Size, ...]) -> TensorMeta:
        if all(type(n) is int for n in shape):
            return replace(self, shape=shape, stride=contiguous_strides(shape), offset=0)  # type: ignore[arg-type]
        return replace(self, shape=shape, stride=symbolic_strides(shape), offset=0)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def size_symbols(size: Size) -> tuple[str, ...]:
    return size.symbols if isinstance(size, SizeExpr) else ()


@dataclass(frozen=True, slots=True)
class Value:
    name: str
    meta: TensorMeta | None = None


@dataclass(frozen=True, slots=True)
class Input:
    """A positional argument of the compiled function: a tensor, or (with `size`) a Python int.

    Size inputs are how torch.compile passes symbolic sizes (SymInt placeholders); `meta` is then a
    0-d int64 placeholder that no pass reads (`meta_table` leaves size inputs out). So it is for
    `opaque` inputs: objects torch.compile passes that the graph never reads (a DTensor's spec).
    """

    name: str
    meta: TensorMeta
    size: SizeExpr | None = None
    opaque: bool = False


@dataclass(frozen=True, slots=True)
class TensorConstant:
    """A tensor bound once, by `key`, from the constants the executor is given (parameters, buffers)."""

    name: str
    key: str
    meta: TensorMeta
    mutable: bool = False  # the graph writes it (a buffer mutation): never folded


@dataclass(frozen=True, slots=True)
class KernelCall:
    """`outputs = kernel(*args, **kwargs)`; `kernel` is a kernel_ops name, or an ATen overload if `fallback`."""

    kernel: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...]
    outputs: tuple[Value | None, ...]  # () for a call kept only for its writes; None: an unused result
    node: str  # the graph node it came from, for the trailing comment
    target: str  # "aten.add.Tensor"
    unpack: bool = False  # the kernel returns a tuple or list, unpacked into `outputs`
    mutates: tuple[str, ...] = ()  # names of arguments the call writes (in-place and out= variants)
    fallback: bool = False  # `kernel` names a torch op (bound from `ops`), not a kernel_ops function
    pointwise: bool = False
    fresh: bool = False  # a torch-op call known to return new tensors (else assumed to alias its arguments)
    jit: bool = False  # `kernel` names a JIT launcher of the program's `jit_kernels`
    seeded: bool = False  # a random op (draws from the generator): never folded into setup or memoised


@dataclass(frozen=True, slots=True)
class Alloc:
    """A fresh uninitialised tensor with the value's meta."""

    value: Value


@dataclass(frozen=True, slots=True)
class View:
    """`value` reinterprets the storage of `source` with the value's size, stride and offset."""

    value: Value
    source: str
    node: str = ""


@dataclass(frozen=True, slots=True)
class Free:
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Constant:
    """A literal bound to a name once (a folded shape, a shape list)."""

    name: str
    value: Arg


@dataclass(frozen=True, slots=True)
class SizeLet:
    """`name = text`: a size symbol bound from an input (`x.shape[1]`) or a size expression computed once."""

    name: str
    text: str
    reads: tuple[str, ...]  # names the text reads (an input, or other size symbols)


@dataclass(frozen=True, slots=True)
class Comment:
    text: str


@dataclass(frozen=True, slots=True)
class Guard:
    """Check the inputs against the compiled metadata; a mismatch goes to the executor's slow path."""

    inputs: tuple[str, ...]
    grad_mode: bool = False  # also refuse to run while grad mode is on (constants require grad)


@dataclass(frozen=True, slots=True)
class Return:
    values: tuple[Arg, ...]
    form: str = "tuple"  # "single" | "tuple" | "list" | "pytree" (rebuilt by the executor's unflatten)


Line = Union[KernelCall, Alloc, View, Free, Constant, SizeLet, Comment, Guard, Return]  # noqa: UP007


def refs(arg: Arg) -> Iterator[str]:
    """Names an argument refers to, in order."""
    if isinstance(arg, Ref):
        yield arg.name
    elif isinstance(arg, SizeExpr):
        yield from arg.symbols
    elif isinstance(arg, tuple):
        for item in arg:
            yield from refs(item)


def uses(line: Line) -> tuple[str, ...]:
    """Names a line reads (or writes in place)."""
    match line:
        case KernelCall(args=args, kwargs=kwargs):
            return tuple(refs(args)) + tuple(refs(tuple(v for _, v in kwargs)))
        case View(source=source, value=value):
            return (source, *(value.meta.symbols if value.meta is not None else ()))
        case Alloc(value=value):
            return value.meta.symbols if value.meta is not None else ()
        case SizeLet(reads=reads):
            return reads
        case Free(names=names) | Guard(inputs=names):
            return names
        case Return(values=values):
            return tuple(refs(values))
        case Constant(value=value):
            return tuple(refs(value))
    return ()


def defs(line: Line) -> tuple[Value, ...]:
    """Values a line defines."""
    match line:
        case KernelCall(outputs=outputs):
            return tuple(v for v in outputs if v is not None)
        case Alloc(value=value) | View(value=value):
            return (value,)
        case Constant(name=name) | SizeLet(name=name):
            return (Value(name),)
    return ()


def producers(lines: Iterable[Line]) -> dict[str, KernelCall]:
    """Value name -> the kernel call defining it."""
    return {v.name: line for line in lines if isinstance(line, KernelCall) for v in line.outputs if v}


def map_leaves(arg: Arg, leaf: Callable[[Arg], Arg]) -> Arg:
    """`arg` with `leaf` applied to every argument that is not a list of arguments."""
    if isinstance(arg, tuple):
        return tuple(map_leaves(a, leaf) for a in arg)
    return leaf(arg)


def substitute(arg: Arg, mapping: Mapping[str, Arg]) -> Arg:
    """Replace references by the mapping's arguments."""
    return map_leaves(arg, lambda a: mapping.get(a.name, a) if isinstance(a, Ref) else a)


def substitute_all(args: tuple[Arg, ...], mapping: Mapping[str, Arg]) -> tuple[Arg, ...]:
    return tuple(substitute(a, mapping) for a in args)


def writing_into(line: KernelCall, kernel: str, out: str) -> KernelCall:
    """`line` as a call of its out= variant `kernel` that writes its result into the value `out`."""
    return KernelCall(
        kernel, line.args, (*line.kwargs, ("out", Ref(out))), (), line.node, line.target,
        mutates=(out,), pointwise=line.pointwise,
    )  # fmt: skip


def substitute_line(line: Line, mapping: Mapping[str, Arg]) -> Line:
    if not mapping:
        return line

    def name(n: str) -> str:
        new = mapping.get(n, Ref(n))
        return new.name if isinstance(new, Ref) else n

    match line:
        case KernelCall(args=args, kwargs=kwargs, mutates=mutates):
            kw = tuple((k, substitute(v, mapping)) for k, v in kwargs)
            return replace(line, args=substitute_all(args, mapping), kwargs=kw, mutates=tuple(map(name, mutates)))
        case View(source=source):
            return replace(line, source=name(source))
        case Return(values=values):
            return replace(line, values=substitute_all(values, mapping))
        case Guard(inputs=inputs):
            return replace(line, inputs=tuple(map(name, inputs)))
        case Free(names=names):
            return replace(line, names=tuple(map(name, names)))
        case Constant(value=value):
            return replace(line, value=substitute(value, mapping))
    return line
