"""Emit one raw METH_FASTCALL C++ function per bound op, and its method-table entry."""

from __future__ import annotations

import ast
import re

from opgen.gen import triton_bindings, user_kernels
from opgen.gen.cpp_types import c_string, cpp_arg, kernel_call_expr
from opgen.spec.checks import CHECKS
from opgen.spec.defaults import parse_default
from opgen.spec.model import Arg, Kernel, OpSpec, Variant

_DEVICE_CASE = {"cpu": "case c10::DeviceType::CPU:", "cuda": "case c10::DeviceType::CUDA:", "default": "default:"}


def c_function_name(spec: OpSpec) -> str:
    return f"kernel_ops_{spec.python_name}"


def comment_text(text: str) -> str:
    """Text for a `//` comment: control characters (a newline would end it) shown as escapes."""
    text = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)
    return text + " " if text.endswith("\\") else text  # a final backslash would join the next line


def required_mask(args: tuple[Arg, ...]) -> int:
    return sum(1 << i for i, arg in enumerate(args) if arg.default is None)


def signature_decl(spec: OpSpec) -> str:
    args = spec.schema.args
    names = ", ".join(c_string(a.name) for a in args)
    positional = sum(1 for a in args if not a.kwarg_only)
    return (
        f"static const opgen::Signature sig({c_string(spec.python_name)}, {{{names}}}, "
        f"{positional}, {hex(required_mask(args))});"
    )


def arg_lines(spec: OpSpec) -> list[str]:
    lines = []
    for index, arg in enumerate(spec.schema.args):
        cpp = cpp_arg(arg, index)
        value = cpp.convert if cpp.default is None else f"slots[{index}] ? {cpp.convert} : {cpp.default}"
        lines.append(f"{cpp.decl} {cpp.var} = {value};")
    return lines


def device_lines(spec: OpSpec) -> list[str]:
    """Collect the devices of tensor arguments (and `device=` of factory ops)."""
    adds = [
        f".{'add_opaque' if arg.name in spec.opaque else 'add'}({cpp_arg(arg, i).var}, {i})"
        for i, arg in enumerate(spec.schema.args)
        if arg.type.base == "Tensor" or (arg.type.base == "Device" and not spec.tensor_args)
    ]
    lines = ["opgen::Devices devices(sig);"]
    if adds:
        lines.append("devices" + "".join(adds) + ";")
    return lines


def check_lines(spec: OpSpec) -> list[str]:
    """Calls of the argument checks the spec asks for (`checks:`), each with its arguments by name."""
    index = {a.name: i for i, a in enumerate(spec.schema.args)}
    lines = []
    for name in spec.checks:
        check = CHECKS[name]
        args = ", ".join(cpp_arg(spec.schema.args[index[a]], index[a]).var for a in check.arg_names)
        lines.append(f"{check.cpp_function}(sig, {args});")
    return lines


def out_overlap_lines(spec: OpSpec) -> list[str]:
    """Out variants refuse an out argument that shares memory with an input (csrc/opgen/bind/checks.h)."""
    if spec.variant is not Variant.OUT:
        return []
    args = spec.schema.args
    outs = [i for i, a in enumerate(args) if a.kwarg_only and a.alias is not None and a.alias.is_write]
    inputs = [i for i, a in enumerate(args) if a.type.base == "Tensor" and i not in outs]
    return [
        f"opgen::checks::out_not_input(sig, {cpp_arg(args[o], o).var}, {o}, {cpp_arg(args[i], i).var}, {i});"
        for o in outs
        if args[o].type.base == "Tensor" and not args[o].type.is_list and not args[o].type.optional
        for i in inputs
    ]


def kernel_call(spec: OpSpec, kernel: Kernel) -> str:
    call = kernel_call_expr(spec, kernel)
    return f"opgen::without_gil([&] {{ return {call}; }})" if spec.release_gil else call


def return_lines(spec: OpSpec, call: str) -> list[str]:
    """Written-in-place results return their argument's own Python object; others are wrapped."""
    schema = spec.schema
    written = {a.alias.alias_set: i for i, a in enumerate(schema.args) if a.alias is not None and a.alias.is_write}
    sources = [written.get(r.alias.alias_set) if r.alias is not None else None for r in schema.returns]
    if sources and all(s is not None for s in sources):
        if len(sources) == 1 and not schema.returns_tuple:
            return [f"{call};", f"return opgen::same(slots[{sources[0]}]);"]
        slots = ", ".join(f"slots[{s}]" for s in sources)
        return [f"{call};", f"return opgen::same_tuple({{{slots}}});"]
    return [f"return opgen::wrap({call});"]


def dispatch_lines(spec: OpSpec) -> list[str]:
    lines = ["switch (devices.type()) {"]
    for kernel in sorted(spec.kernels, key=lambda k: k.backend == "default"):
        call = return_lines(spec, kernel_call(spec, kernel))
        call = user_kernels.at_spec_line(spec, call) if kernel.user else call  # errors in the call name the spec
        body = [_DEVICE_CASE[kernel.backend], *(x if x.startswith("#") else "  " + x for x in call)]
        if kernel.backend == "cuda":
            body = ["#ifdef OPGEN_WITH_CUDA", *body, "#endif"]
        lines += ["  " + x if not x.startswith("#") else x for x in body]
    if "default" not in spec.backends:
        lines += ["  default:", "    devices.no_kernel();"]
    return [*lines, "}"]


def emit_function(spec: OpSpec) -> str:
    n_slots = max(1, len(spec.schema.args))
    body = [
        signature_decl(spec),
        "OPGEN_TRY",
        f"PyObject* slots[{n_slots}];",
        "sig.bind(args, nargs, kwnames, slots);",
        *arg_lines(spec),
        *device_lines(spec),
        *check_lines(spec),
        *out_overlap_lines(spec),
        *(triton_bindings.launch_lines(spec) if spec.triton is not None else dispatch_lines(spec)),
        "OPGEN_CATCH(sig)",
    ]
    indented = "\n".join(("  " + line) if not line.startswith("#") else line for line in body)
    checks = "".join(user_kernels.kernel_check(spec, k) for k in spec.kernels if k.user)
    return checks + (
        f"// {spec.location}: {comment_text(str(spec.schema))}\n"
        f"PyObject* {c_function_name(spec)}(PyObject*, PyObject* const* args, Py_ssize_t nargs, "
        f"PyObject* kwnames) {{\n{indented}\n}}\n"
    )


def text_signature(spec: OpSpec) -> str:
    """`add($module, self, other, *, alpha=1)`, as `inspect.signature` reads it."""
    parts, star = ["$module"], False
    for arg in spec.schema.args:
        if arg.kwarg_only and not star:
            parts.append("*")
            star = True
        parts.append(arg.name if arg.default is None else f"{arg.name}={python_default(arg)}")
    return f"{spec.python_name}({', '.join(parts)})"


def python_default(arg: Arg) -> str:
    assert arg.default is not None
    text = repr(parse_default(arg.type, arg.default))
    if arg.type.base in ("MemoryFormat", "ScalarType") and text != "None":
        return "..."
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return "..."
    return text


def method_def(spec: OpSpec) -> str:
    doc = f"{text_signature(spec)}\n--\n\n{spec.schema}\n\n{spec.doc}".rstrip()
    return (
        f"{{{c_string(spec.python_name)}, "
        f"reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>({c_function_name(spec)})), "
        f"METH_FASTCALL | METH_KEYWORDS, {c_string(doc)}}},"
    )


def headers(specs: list[OpSpec]) -> tuple[list[str], list[str]]:
    """The kernel headers a shard needs: (always, CUDA builds only), sorted and unique."""
    kernels = [k for s in specs for k in s.kernels if not k.user]  # user kernels: user_kernels.include_lines
    common = sorted({k.header for k in kernels if k.backend != "cuda"})
    common += ["opgen/jit/jit_binding.h"] if any(s.triton is not None for s in specs) else []
    cuda = sorted({k.header for k in kernels if k.backend == "cuda"} - set(common))
    return common, cuda
