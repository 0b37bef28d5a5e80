"""The C++ around calls of the user's own kernels: their headers, a compile-time check, and `#line` directives.

The generator cannot read the user's headers, so the compiler checks the spec: every include is guarded by
`__has_include` (a missing header is an `#error` naming the spec line), each user kernel gets a
`static_assert` that it is callable with the arguments the binding passes (its message names the spec line,
the kernel and the C++ signature expected), and the check and the calls are compiled under
`#line <spec line> "<spec file>"`, so that any error there (an unknown name, a wrong signature) points at the
spec. Line numbering returns to the generated file right after: `RESTORE` marks the place, and `restore_lines`
turns it into `#line <n> "<file>"` once the file's text, and so its line numbers, are known.
"""

from __future__ import annotations

from opgen.gen.cpp_types import c_string, cpp_arg, decl_type, pass_expr, value_type
from opgen.spec.model import Arg, Kernel, OpSpec, Return

RESTORE = "#line OPGEN_RESTORE"  # replaced by `#line <next line> "<generated file>"` (restore_lines)
_BY_VALUE = ("int64_t", "double", "bool", "at::ScalarType", "at::Layout", "at::Device", "at::MemoryFormat")
_ADAPTED = {  # what `cpp_types.pass_expr` hands a kernel where it adapts the local
    "opgen::opt_ref(const std::optional<std::vector<int64_t>>": "at::OptionalIntArrayRef",
    "opgen::opt_ref(const std::optional<std::vector<double>>": "std::optional<c10::ArrayRef<double>>",
    "opgen::opt_view(const std::optional<std::string>": "std::optional<c10::string_view>",
}


def at_spec_line(spec: OpSpec, lines: list[str]) -> list[str]:
    """`lines`, compiled as if they stood on the spec's line (errors in them name the spec)."""
    return [f"#line {spec.location.line} {c_string(spec.location.path)}", *lines, RESTORE]


def restore_lines(text: str, filename: str) -> str:
    """Each RESTORE line becomes `#line <number of the next line> "<filename>"`."""
    if RESTORE not in text:
        return text
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if line == RESTORE:
            lines[number - 1] = f"#line {number + 1} {c_string(filename)}"
    return "\n".join(lines)


def include_lines(specs: list[OpSpec]) -> list[str]:
    """The headers of the user kernels of `specs`, each guarded: a missing one is an `#error` at the spec line."""
    first: dict[str, OpSpec] = {}
    for spec in specs:
        for header in spec.includes:
            first.setdefault(header, spec)
    lines: list[str] = []
    for header in sorted(first):
        spec = first[header]
        message = (
            f"{spec.location}: op '{spec.schema.qualified_name}': header <{header}> (its 'includes') not found; "
            "add the folder holding it to INCLUDE_DIRS of opgen_add_extension"
        )
        lines += [
            f"#if __has_include(<{header}>)",
            f"#include <{header}>",
            "#else",
            *at_spec_line(spec, [f"#error {c_string(message)}"]),
            "#endif",
        ]
    return lines


def arg_type(arg: Arg, index: int) -> str:
    """The C++ type of what the binding passes for `arg`: an lvalue of its local, or the adapted value."""
    decl = decl_type(arg)
    passed = pass_expr(arg, f"std::declval<{decl}&>()")
    if passed != f"std::declval<{decl}&>()":
        return f"decltype({passed})"
    return decl if decl.endswith("&") else decl + "&"


def readable_arg(arg: Arg, index: int) -> str:
    """How a kernel declares a parameter it takes `arg` as (`const at::Tensor& self`, `double alpha`)."""
    decl = decl_type(arg)
    passed = pass_expr(arg, "x")
    if passed != "x":
        text = _ADAPTED.get(f"{passed[: passed.index('(')]}({decl}", passed)
    elif decl.endswith("&"):
        text = decl
    else:
        text = value_type(arg.type) if value_type(arg.type) in _BY_VALUE else decl + "&"
    return f"{text} {cpp_arg(arg, index).var}"


def result_type(spec: OpSpec) -> str:
    """What the binding needs back: nothing where it returns written arguments, else what `opgen::wrap` takes."""
    schema = spec.schema
    written = {a.alias.alias_set for a in schema.args if a.alias is not None and a.alias.is_write}
    if schema.returns and all(r.alias is not None and r.alias.alias_set in written for r in schema.returns):
        return "void"
    types = [_return_type(r) for r in schema.returns]
    return types[0] if len(types) == 1 and not schema.returns_tuple else f"std::tuple<{', '.join(types)}>"


def _return_type(ret: Return) -> str:
    if ret.type.base == "Tensor":
        return "std::vector<at::Tensor>" if ret.type.is_list else "at::Tensor"
    return "int64_t"


def check_name(spec: OpSpec, kernel: Kernel) -> str:
    return f"opgen_user_kernel_{spec.python_name}_{kernel.backend}"


def kernel_check(spec: OpSpec, kernel: Kernel) -> str:
    """A compile-time check that `kernel` takes what the binding of `spec` passes, at the spec's line."""
    name, fn, forward = check_name(spec, kernel), kernel.qualified_name, "std::forward<decltype(a)>(a)..."
    args = spec.schema.args
    readable = f"{result_type(spec)}({', '.join(readable_arg(a, i) for i, a in enumerate(args))})"
    message = f"{spec.location}: kernel {fn} must be callable as {readable}"
    invocable = ", ".join([result_type(spec), f"decltype({name})", *(arg_type(a, i) for i, a in enumerate(args))])
    lines = at_spec_line(
        spec,
        [
            f"[[maybe_unused]] constexpr auto {name} = [](auto&&... a) -> decltype({fn}({forward})) {{",
            f"  return {fn}({forward});",
            "};",
            f"static_assert(std::is_invocable_r_v<{invocable}>,",
            f"              {c_string(message)});",
        ],
    )
    guard = kernel.backend == "cuda"
    return "\n".join(["#ifdef OPGEN_WITH_CUDA"] * guard + lines + ["#endif"] * guard) + "\n"
