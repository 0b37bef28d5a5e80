"""The C++ body of a Triton op's binding: check the tensors, allocate outputs, launch, return.

The arguments have been bound and converted as for any op (`bindings.arg_lines`) and their devices
collected (`bindings.device_lines`). A Triton kernel gets raw pointers, so every tensor must be on
a CUDA device (a CPU tensor is refused, even a 0-dim one), then `opgen::jit::launch` packs the
kernel's runtime parameters in order. The launcher (csrc/opgen/jit/jit.h) gets the op's registry JSON,
which holds the kernel's name, grid and configs, on its first call.
"""

from __future__ import annotations

from opgen.gen.cpp_types import c_string, cpp_var
from opgen.gen.registry import entry_json
from opgen.jit import expr as jx
from opgen.spec.model import Arg, OpSpec, TritonArg, TritonKernel
from opgen.spec.triton import DTYPES

JIT = "opgen::jit::"


def spec_kernel_var(spec: OpSpec) -> str:
    return f"kSpec_{spec.python_name}"


def check_lines(spec: OpSpec) -> list[str]:
    """Every tensor argument on CUDA; then the section's contiguity and same-shape requirements."""
    kernel = _kernel(spec)
    index = {a.name: i for i, a in enumerate(spec.schema.args)}
    lines = [
        f"{JIT}require_cuda(sig, {cpp_var(a.name)}, {i});"
        for i, a in enumerate(spec.schema.args)
        if a.type.base == "Tensor" and not a.type.is_list
    ]
    lines += [f"{JIT}require_contiguous(sig, {cpp_var(n)}, {index[n]});" for n in kernel.contiguous]
    first, *rest = kernel.same_shape or ("",)
    lines += [
        f"{JIT}require_same_shape(sig, {cpp_var(first)}, {index[first]}, {cpp_var(n)}, {index[n]});" for n in rest
    ]
    return lines


def alloc_lines(spec: OpSpec) -> list[str]:
    lines = []
    for out in _kernel(spec).outputs:
        dtype = f", at::ScalarType::{DTYPES[out.dtype]}" if out.dtype is not None else ""
        lines.append(f"at::Tensor {cpp_var(out.name)} = {JIT}empty_like({cpp_var(out.like)}{dtype});")
    return lines


def kernel_arg(arg: TritonArg, schema_args: dict[str, Arg]) -> str:
    """The `opgen::jit::*_arg(...)` passing one runtime parameter."""
    value = arg.value
    if not isinstance(value, jx.Name):
        return f"{JIT}int_arg({jx.to_cpp(value, cpp_var)})"
    var = cpp_var(value.name)
    source = schema_args.get(value.name)
    if source is None:  # an output
        return f"{JIT}tensor_arg({var})"
    match source.type.base if not source.type.is_list else "list":
        case "Tensor":
            return f"{JIT}tensor_arg({var})"
        case "int" | "SymInt":
            return f"{JIT}int_arg({var})"
        case "float":
            return f"{JIT}float_arg({var})"
        case "bool":
            return f"{JIT}bool_arg({var})"
        case "Scalar":
            return f"{JIT}scalar_arg({var})"
    raise ValueError(f"{arg.param}: cannot pass a '{source.type}'")  # validation refuses these


def launch_lines(spec: OpSpec) -> list[str]:
    """Checks, allocation, the launch and the return: what follows the device collection."""
    kernel = _kernel(spec)
    schema_args = {a.name: a for a in spec.schema.args}
    args = ", ".join(kernel_arg(a, schema_args) for a in kernel.args)
    var = spec_kernel_var(spec)
    return [
        *check_lines(spec),
        *alloc_lines(spec),
        f"static {JIT}SpecKernel {var}{{{c_string(spec.python_name)}, {c_string(entry_json(spec))}}};",
        f"{JIT}launch({var}, {{{args}}});",
        *_return_lines(spec, kernel),
    ]


def _return_lines(spec: OpSpec, kernel: TritonKernel) -> list[str]:
    schema = spec.schema
    if not kernel.outputs:  # every return is a written argument: return its own Python object
        written = {a.alias.alias_set: i for i, a in enumerate(schema.args) if a.alias is not None and a.alias.is_write}
        slots = [f"slots[{written[r.alias.alias_set]}]" for r in schema.returns if r.alias is not None]
        if len(slots) == 1 and not schema.returns_tuple:
            return [f"return opgen::same({slots[0]});"]
        return [f"return opgen::same_tuple({{{', '.join(slots)}}});"]
    moved = [f"std::move({cpp_var(o.name)})" for o in kernel.outputs]
    if len(moved) == 1 and not schema.returns_tuple:
        return [f"return opgen::wrap({moved[0]});"]
    return [f"return opgen::wrap(std::make_tuple({', '.join(moved)}));"]


def _kernel(spec: OpSpec) -> TritonKernel:
    assert spec.triton is not None, f"{spec.python_name} is not a Triton op"
    return spec.triton
