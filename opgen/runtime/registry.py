"""The kernel_ops args-info registry, indexed by ATen overload, and argument binding against it.

This is the runtime's only source of op metadata: which ATen overloads have a kernel, their
argument names, kinds and defaults, and the in-place/out siblings memory planning may call. It is
built from `kernel_ops.get_kernel_ops_args_info()` (plain dicts), never from ops.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opgen.runtime.ir import Arg, Sym

# ScalarType spellings of schema defaults -> torch dtype names.
_SCALAR_TYPES = {
    "Byte": "uint8", "Char": "int8", "Short": "int16", "Int": "int32", "Long": "int64", "Half": "float16",
    "Float": "float32", "Double": "float64", "Bool": "bool", "BFloat16": "bfloat16",
}  # fmt: skip
_SYM_KINDS = {"MemoryFormat": "memory_format", "Layout": "layout", "Device": "device", "ScalarType": "dtype"}


class _NoDefault:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _NoDefault()


@dataclass(frozen=True, slots=True)
class ArgInfo:
    name: str
    type: str
    is_tensor: bool
    kwarg_only: bool
    default: Any  # an IR argument, or REQUIRED
    mutable: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True, slots=True)
class OpInfo:
    name: str  # the kernel_ops function (an extension's: prefixed, `my_ops__scaled_add`)
    aten: str  # "aten::add.Tensor"
    args: tuple[ArgInfo, ...]
    returns: tuple[str, ...]  # return types
    returns_tuple: bool
    variant: str
    functional: str | None
    inplace: str | None
    out: str | None
    is_view: bool
    mutates: tuple[str, ...]
    view_source: str | None = None  # the argument a view's result aliases
    candidate_for: str | None = None  # Triton ops: the ATen overload they compute ("aten::add.Tensor")
    contiguous: tuple[str, ...] = ()  # Triton ops: arguments that must be contiguous
    same_shape: tuple[str, ...] = ()  # Triton ops: arguments that must have one shape
    kernels: tuple[str, ...] = ()  # the C++ kernels, one per backend ("at::cpu::add_outf")
    module: str = ""  # the extension module that binds it (`opgen.runtime.extension_registry`); "": kernel_ops

    @property
    def copies_into_out(self) -> bool:
        """An out variant whose only kernel is a composite one: for most (ATen's `autogen` out variants:
        relu.out, convolution.out, native_layer_norm.out...) the functional kernel, then a copy into out."""
        return (
            self.variant == "out"
            and bool(self.kernels)
            and all(k.startswith("at::compositeexplicitautograd::") for k in self.kernels)
        )

    @property
    def returns_list(self) -> bool:
        return len(self.returns) == 1 and self.returns[0].endswith("[]")

    def arg(self, name: str) -> ArgInfo:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(f"kernel_ops.{self.name} has no argument '{name}'")


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What ATen's kernels do on this machine that passes decide by, as plain data (found by
    `opgen.runtime.execution.device_facts`; none where nothing was asked, as on a CPU machine)."""

    # (dtype, with a mask) where CUDA attention with `enable_gqa` runs a fused kernel that reads grouped
    # key/value heads in place (flash attention or cuDNN), not the math path. Sorted, as every field
    # here is data with one repr: the facts join the cache key, and a set's order (string hashing)
    # changes from process to process, so no process found another's entries.
    grouped_attention: tuple[tuple[str, bool], ...] = ()
    # Generated Triton kernels can start while the kernel before them finishes (programmatic dependent
    # launch: compute capability 9.0 or newer, Triton's gdc intrinsics; OPGEN_DEPENDENT_LAUNCH=0 turns it off).
    dependent_launch: bool = False


@dataclass(frozen=True, slots=True)
class KernelRegistry:
    by_name: Mapping[str, OpInfo]
    by_aten: Mapping[str, OpInfo]
    build_id: str
    facts: DeviceFacts = DeviceFacts()

    def lookup(self, aten: str) -> OpInfo | None:
        """The functional binding of an overload (`aten::relu` or `aten::relu.default`)."""
        return self.by_aten.get(aten.removesuffix(".default"))

    def candidates(self, aten: str) -> list[OpInfo]:
        """Kernels that compute the overload `aten` (`aten::add.Tensor`) besides its own binding."""
        aten = aten.removesuffix(".default")
        return [i for i in self.by_name.values() if i.candidate_for is not None and i.candidate_for == aten]

    def sibling(self, info: OpInfo, variant: str) -> OpInfo | None:
        name = {"inplace": info.inplace, "out": info.out, "functional": info.functional}[variant]
        return self.by_name.get(name) if name else None

    def plain_out(self, name: str) -> OpInfo | None:
        """The out= variant of the functional `name` that takes its arguments plus `out` and writes
        into it with its own kernel (not a functional call and a copy: `copies_into_out`), or None."""
        info = self.by_name.get(name)
        variant = self.sibling(info, "out") if info is not None else None
        if info is None or variant is None or variant.copies_into_out:
            return None
        plain = [a.name for a in variant.args] == [a.name for a in info.args] + ["out"]
        return variant if plain else None


def scalar_overload(registry: KernelRegistry, info: OpInfo, names: set[str]) -> OpInfo | None:
    """The same op's overload taking `Scalar` where `info` takes the tensors `names` (mul.Scalar for mul.Tensor)."""
    base = info.aten.split(".")[0]
    for other in registry.by_aten.values():
        if other.variant != "functional" or other.aten.split(".")[0] != base or other is info:
            continue
        if [a.name for a in other.args] != [a.name for a in info.args]:
            continue
        if all(other.arg(n).type.startswith("Scalar") for n in names):
            return other
    return None


def load_registry(kernel_ops: Any) -> KernelRegistry:
    raw = kernel_ops.get_kernel_ops_args_info()
    infos = {name: op_info(entry) for name, entry in raw.items()}
    return KernelRegistry(infos, {i.aten: i for i in infos.values()}, str(kernel_ops.BUILD_ID))


def overload_name(dotted: str) -> str:
    """The registry's name of an op overload written `ns.name.overload`: `aten.add.Tensor` -> `aten::add.Tensor`,
    `mylib.scaled_add.default` -> `mylib::scaled_add` (a custom op, which a user's extension binds)."""
    namespace, _, rest = dotted.partition(".")
    return f"{namespace}::{rest}".removesuffix(".default")


def op_info(entry: Mapping[str, Any]) -> OpInfo:
    triton = entry.get("triton") or {}
    target = triton.get("candidate_for")
    return OpInfo(
        candidate_for=overload_name(target) if target else None,
        contiguous=tuple(triton.get("contiguous", ())),
        same_shape=tuple(triton.get("same_shape", ())),
        kernels=tuple(entry.get("kernels", {}).values()),
        name=entry["name"],
        aten=entry["aten"],
        args=tuple(arg_info(a) for a in entry["args"]),
        returns=tuple(r["type"] for r in entry["returns"]),
        returns_tuple=bool(entry["returns_tuple"]),
        variant=entry["variant"],
        functional=entry.get("functional"),
        inplace=entry.get("inplace"),
        out=entry.get("out"),
        is_view=bool(entry["is_view"]),
        mutates=tuple(entry.get("mutates", ())),
        view_source=next((r["aliases_arg"] for r in entry["returns"] if "aliases_arg" in r), None)
        if entry["is_view"]
        else None,
    )


def arg_info(entry: Mapping[str, Any]) -> ArgInfo:
    default = default_arg(entry["type"], entry["default"]) if "default" in entry else REQUIRED
    return ArgInfo(
        name=entry["name"],
        type=entry["type"],
        is_tensor=entry["kind"] == "input",
        kwarg_only=bool(entry["kwarg_only"]),
        default=default,
        mutable=bool(entry.get("mutable", False)),
    )


def default_arg(type_: str, value: Any) -> Arg:
    """A registry default as the IR argument a graph would carry for it."""
    kind = _SYM_KINDS.get(type_.rstrip("?"))
    if kind is not None and isinstance(value, str):
        return Sym(kind, _SCALAR_TYPES.get(value, value))
    if isinstance(value, list):
        return tuple(value)
    if (isinstance(value, float) and value != value) or value in (float("inf"), float("-inf")):
        return Sym("float", repr(value))
    return value  # type: ignore[no-any-return]


class BindError(ValueError):
    """The graph's arguments do not fit the kernel's schema."""


def bind(info: OpInfo, args: Sequence[Arg], kwargs: Mapping[str, Arg]) -> dict[str, Arg]:
    """Map a call's positional and keyword arguments onto the kernel's argument names, with defaults."""
    positional = [a for a in info.args if not a.kwarg_only]
    if len(args) > len(positional):
        raise BindError(f"{info.aten} takes {len(positional)} positional arguments, the graph passes {len(args)}")
    values: dict[str, Arg] = {a.name: v for a, v in zip(positional, args, strict=False)}
    for key, value in kwargs.items():
        if key in values or all(a.name != key for a in info.args):
            raise BindError(f"{info.aten}: unexpected or repeated argument '{key}'")
        values[key] = value
    for a in info.args:
        if a.name not in values:
            if a.required:
                raise BindError(f"{info.aten}: the graph passes no value for required argument '{a.name}'")
            values[a.name] = a.default
    return values


def is_default(a: ArgInfo, value: Arg) -> bool:
    return not a.required and type(value) is type(a.default) and value == a.default


def call_args(info: OpInfo, values: Mapping[str, Arg]) -> tuple[tuple[Arg, ...], tuple[tuple[str, Arg], ...]]:
    """Positional arguments where the schema allows, keywords only where it forces them; defaults left out."""
    positional = [a for a in info.args if not a.kwarg_only]
    while positional and is_default(positional[-1], values[positional[-1].name]):
        positional.pop()
    keywords = tuple((a.name, values[a.name]) for a in info.args if a.kwarg_only and not is_default(a, values[a.name]))
    return tuple(values[a.name] for a in positional), keywords
