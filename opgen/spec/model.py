"""The typed, frozen model of an op spec: schema types, arguments, returns and op records.

Everything here is plain data. Validation lives in `opgen.spec.validate`; parsing of the ATen
schema language in `opgen.spec.schema`. Nothing in this package imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from opgen.jit.expr import Expr

# The scalar (non-list) base types the schema language may name, in the order error messages list them.
BASE_TYPES = (
    "Tensor",
    "int",
    "SymInt",
    "float",
    "bool",
    "Scalar",
    "str",
    "ScalarType",
    "Layout",
    "Device",
    "MemoryFormat",
)

# Backends a kernel can be declared for. `default` is a device-agnostic (composite) kernel used for
# any device that has no kernel of its own.
BACKENDS = ("cpu", "cuda", "default")

# ATen namespaces holding direct kernels (`ATen/ops/<op>_<key>_dispatch.h`), and the backends each may serve.
KERNEL_NAMESPACES = {
    "cpu": ("cpu",),
    "cuda": ("cuda",),
    "compositeexplicitautograd": BACKENDS,
    "compositeexplicitautogradnonfunctional": BACKENDS,
    "compositeimplicitautograd": BACKENDS,
}
# opgen's own kernels: hand-written C++ in `opgen::kernels` (csrc/opgen/kernels/kernels.h) that call torch
# functions no dispatch header declares (oneDNN's fused kernels); CPU only.
OWN_NAMESPACE = "opgen::kernels"
OWN_HEADER = "opgen/kernels/kernels.h"
KERNEL_NAMESPACES[OWN_NAMESPACE] = ("cpu",)


@dataclass(frozen=True, slots=True)
class Location:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True, slots=True)
class Type:
    """A schema type such as `Tensor`, `int[2]`, `Tensor?[]` or `int[1]?`."""

    base: str
    optional: bool = False  # the whole value may be None (`int?`, `int[]?`)
    is_list: bool = False
    size: int | None = None  # fixed list size (`int[2]`)
    elem_optional: bool = False  # list elements may be None (`Tensor?[]`)

    def __str__(self) -> str:
        text = self.base + ("?" if self.elem_optional else "")
        if self.is_list:
            text += f"[{self.size if self.size is not None else ''}]"
        return text + ("?" if self.optional else "")


@dataclass(frozen=True, slots=True)
class Alias:
    """An alias annotation: `Tensor(a)` (a view of set `a`) or `Tensor(a!)` (writes set `a`)."""

    alias_set: str
    is_write: bool
    wildcard: bool = False  # `(a -> *)`: list elements alias into the wildcard set

    def __str__(self) -> str:
        return f"({self.alias_set}{'!' if self.is_write else ''}{' -> *' if self.wildcard else ''})"


@dataclass(frozen=True, slots=True)
class Arg:
    name: str
    type: Type
    kwarg_only: bool = False
    alias: Alias | None = None
    default: str | None = None  # the default as written in the schema

    def __str__(self) -> str:
        type_text = str(self.type)
        if self.alias is not None:
            type_text = self.type.base + str(self.alias) + type_text[len(self.type.base) :]
        text = f"{type_text} {self.name}"
        return text if self.default is None else f"{text}={self.default}"


@dataclass(frozen=True, slots=True)
class Return:
    type: Type
    name: str | None = None
    alias: Alias | None = None

    def __str__(self) -> str:
        type_text = str(self.type)
        if self.alias is not None:
            type_text = self.type.base + str(self.alias) + type_text[len(self.type.base) :]
        return type_text if self.name is None else f"{type_text} {self.name}"


@dataclass(frozen=True, slots=True)
class Schema:
    name: str
    overload: str
    args: tuple[Arg, ...]
    returns: tuple[Return, ...]
    returns_tuple: bool = False  # written as `(...)`, even with one element

    @property
    def qualified_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    def __str__(self) -> str:
        parts: list[str] = []
        star_done = False
        for arg in self.args:
            if arg.kwarg_only and not star_done:
                parts.append("*")
                star_done = True
            parts.append(str(arg))
        returns = ", ".join(str(r) for r in self.returns)
        if self.returns_tuple or len(self.returns) != 1:
            returns = f"({returns})"
        return f"{self.qualified_name}({', '.join(parts)}) -> {returns}"


class Variant(enum.Enum):
    FUNCTIONAL = "functional"
    INPLACE = "inplace"
    OUT = "out"


@dataclass(frozen=True, slots=True)
class Kernel:
    backend: str  # one of BACKENDS
    namespace: str  # one of KERNEL_NAMESPACES; for a user kernel its own C++ namespace (`mylib::ops`)
    function: str  # C++ function name inside `at::<namespace>` (or OWN_NAMESPACE, or the user's namespace)
    user: bool = False  # the user's own C++ function, declared by the headers of its entry's `includes:`

    @property
    def qualified_name(self) -> str:
        if self.namespace == OWN_NAMESPACE or self.user:
            return f"{self.namespace}::{self.function}"
        return f"at::{self.namespace}::{self.function}"

    @property
    def header(self) -> str:
        """The header declaring this kernel: ATen's is named after the op, without `_`/`_out`/`_outf`.
        A user kernel's headers are its entry's `includes` (`OpSpec.includes`), not this."""
        assert not self.user, "a user kernel's headers are OpSpec.includes"
        if self.namespace == OWN_NAMESPACE:
            return OWN_HEADER
        return f"ATen/ops/{kernel_op_name(self.function)}_{self.namespace}_dispatch.h"

    @property
    def own(self) -> bool:
        """One of opgen's own kernels (csrc/opgen/kernels/kernels.h), not an ATen one."""
        return self.namespace == OWN_NAMESPACE


def kernel_op_name(function: str) -> str:
    """`add_outf` -> `add`, `add_` -> `add`, `_softmax` -> `_softmax`, `relu_` -> `relu`."""
    for suffix in ("_outf", "_out"):
        if function.endswith(suffix):
            return function[: -len(suffix)]
    if function.endswith("_") and not function.endswith("__"):
        return function[:-1]
    return function


MetaValue = int | float | bool | str


@dataclass(frozen=True, slots=True)
class TritonArg:
    """One runtime parameter of a Triton kernel and the expression that computes it."""

    param: str  # the kernel's parameter name
    text: str  # the expression as written (`numel(self)`, `alpha`, `out`)
    value: Expr  # parsed by opgen.jit.expr


@dataclass(frozen=True, slots=True)
class TritonOutput:
    """A returned tensor the binding allocates: `empty_like(like)` or `empty_like(like, dtype=...)`."""

    name: str
    like: str  # a Tensor argument of the schema
    dtype: str | None  # a torch dtype name (`float32`), or None: the dtype of `like`

    @property
    def text(self) -> str:
        return f"empty_like({self.like})" if self.dtype is None else f"empty_like({self.like}, dtype={self.dtype})"


@dataclass(frozen=True, slots=True)
class TritonConfig:
    """One launch configuration: constexpr (meta) values and launch options."""

    meta: tuple[tuple[str, MetaValue], ...]
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True, slots=True)
class TritonKernel:
    """The `triton:` section of a spec op: which kernel, its arguments, outputs, grid and configs."""

    kernel: str  # `module.path:qualname` of a @triton.jit function
    args: tuple[TritonArg, ...]  # the kernel's runtime parameters, in its order
    outputs: tuple[TritonOutput, ...]  # allocated results, in return order
    grid: tuple[str, ...]  # 1-3 expressions over parameters and constexprs
    configs: tuple[TritonConfig, ...]
    candidate_for: str | None = None  # `aten.add.Tensor`: an ATen overload it computes identically
    contiguous: tuple[str, ...] = ()  # tensor arguments the binding requires to be contiguous
    same_shape: tuple[str, ...] = ()  # tensor arguments the binding requires to share one shape

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(a.param for a in self.args)


@dataclass(frozen=True, slots=True)
class TorchOp:
    """`torch_op: mylib::scaled_add` (or `mylib::scaled_add.overload`): the torch.library op an entry implements."""

    namespace: str
    name: str
    overload: str = "default"

    @property
    def path(self) -> str:
        """`mylib.scaled_add.default`: where torch puts it (`torch.ops.mylib.scaled_add.default`)."""
        return f"{self.namespace}.{self.name}.{self.overload}"

    @property
    def registry_name(self) -> str:
        """`mylib::scaled_add` (`mylib::f.out`): the registry's `aten` name, as `OpOverload.name()` gives it."""
        base = f"{self.namespace}::{self.name}"
        return base if self.overload == "default" else f"{base}.{self.overload}"


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One bound Python function: a schema, its kernels and where it came from."""

    schema: Schema
    python_name: str
    kernels: tuple[Kernel, ...]
    variant: Variant
    group: str  # python name of the functional op this one belongs to
    doc: str
    release_gil: bool
    location: Location
    triton: TritonKernel | None = None  # a Triton op: `kernels` is empty
    checks: tuple[str, ...] = ()  # argument checks the binding runs before the kernel (spec/checks.py)
    opaque: tuple[str, ...] = ()  # Tensor arguments that may be opaque oneDNN tensors (own kernels only)
    includes: tuple[str, ...] = ()  # headers declaring the entry's user kernels (`mylib/scaled_add.h`)
    torch_op: TorchOp | None = None  # the torch.library op the entry implements (functional op only)

    @property
    def backends(self) -> tuple[str, ...]:
        return ("triton",) if self.triton is not None else tuple(k.backend for k in self.kernels)

    @property
    def registry_name(self) -> str:
        """The registry's `aten` name: `aten::add.Tensor`; `opgen::<schema name>` for an op that binds no ATen
        overload (Triton, opgen's or the user's kernels); the `torch_op` (`mylib::scaled_add`) where one is given."""
        if self.torch_op is not None:
            return self.torch_op.registry_name
        own = self.triton is not None or any(k.own or k.user for k in self.kernels)
        return f"{'opgen' if own else 'aten'}::{self.schema.qualified_name}"

    @property
    def tensor_args(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.schema.args if a.type.base == "Tensor")
