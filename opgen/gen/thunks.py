"""Emit the C++ executor's thunks: per kernel_ops function and backend, `thunk_<fn>_<backend>(Frame&, const Instr&)`.

A thunk is the binding without Python: it unboxes its arguments from the executor's registers
(`c10::IValue`s, csrc/opgen/exec/thunk.h) into the locals `cpp_types.cpp_arg` declares, calls the kernel
through `cpp_types.kernel_call_expr` (the call the binding makes), and stores the results. The
executor (csrc/opgen/exec/executor.cpp) finds a thunk by (function, backend) in the tables emitted here.
Triton ops have no thunk (the C++ backend leaves programs that call them to the Python one).
"""

from __future__ import annotations

from opgen.gen import user_kernels
from opgen.gen.bindings import comment_text
from opgen.gen.cpp_types import c_string, cpp_arg, decl_type, default_expr, kernel_call_expr, value_type
from opgen.spec.model import Arg, Kernel, OpSpec

THUNK_BACKENDS = ("cpu", "default", "cuda")


def thunk_name(spec: OpSpec, kernel: Kernel) -> str:
    return f"thunk_{spec.python_name}_{kernel.backend}"


def thunk_kernels(spec: OpSpec) -> list[Kernel]:
    """The kernels of an op that get a thunk, in a stable order (none for Triton ops)."""
    if spec.triton is not None:
        return []
    return sorted((k for k in spec.kernels if k.backend in THUNK_BACKENDS), key=lambda k: k.backend)


def unbox_expr(arg: Arg, index: int) -> str:
    """The expression reading argument `index` from the instruction's operands."""
    type_ = arg.type
    if type_.base == "Tensor" and not type_.is_list and not type_.optional:
        written = arg.alias is not None and arg.alias.is_write
        return f"f.{'mutable_tensor' if written else 'tensor'}(in, {index})"
    return f"f.arg<{value_type(type_)}>(in, {index})"


def arg_line(arg: Arg, index: int) -> str:
    var = cpp_arg(arg, index).var
    value = unbox_expr(arg, index)
    default = default_expr(arg)
    if default is not None:
        value = f"f.has(in, {index}) ? {value} : {default}"
    return f"{decl_type(arg)} {var} = {value};"


def emit_thunk(spec: OpSpec, kernel: Kernel) -> str:
    call = kernel_call_expr(spec, kernel)
    body = [arg_line(a, i) for i, a in enumerate(spec.schema.args)]
    result = [f"f.result(in, {call});" if spec.schema.returns else f"{call};"]
    body += user_kernels.at_spec_line(spec, result) if kernel.user else result  # errors in the call name the spec
    text = "\n".join(line if line.startswith("#") else "  " + line for line in body)
    thunk = (
        f"// {spec.location}: {comment_text(str(spec.schema))}\n"
        f"void {thunk_name(spec, kernel)}(opgen::exec::Frame& f, const opgen::exec::Instr& in) {{\n{text}\n}}\n"
    )
    return f"#ifdef OPGEN_WITH_CUDA\n{thunk}#endif\n" if kernel.backend == "cuda" else thunk


def table_entry(spec: OpSpec, kernel: Kernel) -> str:
    release = "true" if spec.release_gil else "false"
    entry = f"{{{c_string(spec.python_name)}, {c_string(kernel.backend)}, {thunk_name(spec, kernel)}, {release}}},"
    return f"#ifdef OPGEN_WITH_CUDA\n    {entry}\n#endif" if kernel.backend == "cuda" else f"    {entry}"


def headers(specs: list[OpSpec]) -> tuple[list[str], list[str]]:
    """The kernel headers a thunk shard needs: (always, CUDA builds only), sorted and unique."""
    kernels = [k for s in specs for k in thunk_kernels(s) if not k.user]  # user kernels: user_kernels.include_lines
    common = sorted({k.header for k in kernels if k.backend != "cuda"})
    cuda = sorted({k.header for k in kernels if k.backend == "cuda"} - set(common))
    return common, cuda
