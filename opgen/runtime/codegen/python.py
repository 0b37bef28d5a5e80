"""The Python backend: a `Program` -> straight-line Python source calling kernel_ops.

The source defines `make(kernel_ops, ops, constants, symbols, rt)`, run once by the executor. It
binds every kernel, ATen fallback op, symbol and constant to a local, runs the setup lines, and
returns the inner function, whose body is one statement per line of the program with a trailing
comment naming the graph node. Everything the call path touches is a closure local. By default the
function has a profiled twin beside it, which it hands the call to while a profiler is on
(`profiled`: each kernel call in a profiler range).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from opgen.runtime.codegen import profiled as prof
from opgen.runtime.codegen.backend import Backend, Source
from opgen.runtime.codegen.manifest import manifest
from opgen.runtime.ir import (
    Alloc,
    Arg,
    Comment,
    Constant,
    Free,
    FusedKernel,
    Guard,
    KernelCall,
    Line,
    Program,
    Ref,
    Return,
    SizeExpr,
    SizeLet,
    Sym,
    TensorMeta,
    View,
    defs,
    memo_key,
)
from opgen.runtime.ir.names import fallback_local, sym_local


def literal(arg: Arg) -> str:
    """Python source for an IR argument."""
    match arg:
        case Ref(name=name):
            return name
        case Sym():
            return sym_local(arg)
        case SizeExpr(text=text):
            return text
        case tuple():
            items = ", ".join(literal(a) for a in arg)
            return f"({items},)" if len(arg) == 1 else f"({items})"
        case bool() | None | int() | str():
            return repr(arg)
        case float():
            return repr(arg)
    raise TypeError(f"cannot print IR argument {arg!r}")


def call_expr(line: KernelCall) -> str:
    callee = fallback_local(line.kernel) if line.fallback else line.kernel
    parts = [literal(a) for a in line.args] + [f"{k}={literal(v)}" for k, v in line.kwargs]
    return f"{callee}({', '.join(parts)})"


def call_text(line: KernelCall) -> str:
    call = call_expr(line)
    names = [v.name if v else "_" for v in line.outputs]
    if line.unpack and any(v is not None for v in line.outputs):
        call = f"{', '.join(names)}{',' if len(names) == 1 else ''} = {call}"
    elif len(line.outputs) == 1 and line.outputs[0] is not None:
        call = f"{names[0]} = {call}"
    return f"{call}  # {line.node}: {line.target}"


def fused_text(fused: FusedKernel) -> list[str]:
    """The ATen calls a fused kernel replaces, as a function: the other candidate of its choice."""
    outs = ", ".join(v.name for v in fused.outputs)
    ret = outs if len(fused.outputs) == 1 else f"({outs})"
    return [
        f"    def {fused.local}_aten({', '.join(fused.inputs)}):  # the ATen kernels {fused.name} replaces",
        *(f"        {call_text(line)}" for line in fused.lines),
        *([f"        return {ret}"] if fused.outputs else []),
        "",
        f'    {fused.local} = rt.jit["{fused.local}"]({fused.local}_aten)  # Triton or ATen, picked on the first call',
    ]


def input_text(meta: TensorMeta, size: SizeExpr | None) -> str:
    """`float32[s77, 16] on cpu` (sizes as their expressions), or `int size s77` for a size input."""
    if size is not None:
        return f"int size {size.text}"
    shape = ", ".join(literal(n) for n in meta.shape)
    return f"{meta.dtype}[{shape}] on {meta.device}"


def _returns_last_call(lines: Sequence[Line]) -> bool:
    """`buf = call(...); return buf` prints as `return call(...)`."""
    if len(lines) < 2 or not isinstance(lines[-1], Return) or not isinstance(lines[-2], KernelCall):
        return False
    ret, call = lines[-1], lines[-2]
    single = len(call.outputs) == 1 and call.outputs[0] is not None and not call.unpack
    return single and ret.form == "single" and ret.values == (Ref(call.outputs[0].name),)  # type: ignore[union-attr]


def memo_names(program: Program) -> list[str]:
    """The closure variables the size memo keeps between calls: its key, then its values."""
    return ["_memo_key", *(v.name for line in program.memo for v in defs(line))] if program.memo else []


def _nonlocal_text(names: Sequence[str], width: int = 8) -> list[str]:
    return [f"nonlocal {', '.join(names[i : i + width])}" for i in range(0, len(names), width)]


def return_text(line: Return) -> str:
    values = [literal(v) for v in line.values]
    match line.form:
        case "single":
            return f"return {values[0]}"
        case "list":
            return f"return [{', '.join(values)}]"
        case "pytree":
            return f"return _unflatten(({', '.join(values)}{',' if len(values) == 1 else ''}))"
    return f"return ({', '.join(values)}{',' if len(values) == 1 else ''})"


class PythonBackend(Backend):
    """Python calling kernel_ops; see the module docstring for the shape of the source.

    `profiled`: also print the function's profiled twin (`codegen.profiled`) and hand it the call
    while a profiler is on.
    """

    def __init__(self, profiled: bool = True) -> None:
        self.profiled = profiled

    def kernel_call(self, line: KernelCall) -> list[str]:
        return [call_text(line)]

    def alloc(self, line: Alloc) -> list[str]:
        meta = line.value.meta
        assert meta is not None, f"Alloc of {line.value.name} has no meta"
        dev = sym_local(Sym("device", meta.device))
        size = f"{literal(meta.shape)}, {literal(meta.stride)}"
        return [f"{line.value.name} = empty_strided({size}, dtype={meta.dtype}, device={dev})"]

    def view(self, line: View) -> list[str]:
        meta = line.value.meta
        assert meta is not None, f"View {line.value.name} has no meta"
        comment = f"  # {line.node}" if line.node else ""
        size = f"{literal(meta.shape)}, {literal(meta.stride)}, {literal(meta.offset)}"
        return [f"{line.value.name} = as_strided({line.source}, {size}){comment}"]

    def free(self, line: Free) -> list[str]:
        return [f"del {', '.join(line.names)}"] if line.names else []

    def constant(self, line: Constant) -> list[str]:
        return [f"{line.name} = {literal(line.value)}"]

    def size_let(self, line: SizeLet) -> list[str]:
        return [f"{line.name} = {line.text}"]

    def comment(self, line: Comment) -> list[str]:
        return [f"# {t}" for t in line.text.splitlines()]

    def guard(self, line: Guard) -> list[str]:
        """The input check; the slow path returns another specialization's result, raises, or says proceed."""
        args = ", ".join(line.inputs)
        test = f"not _check({args})" + (" or _grad_enabled()" if line.grad_mode else "")
        return [
            f"if {test}:",
            f"    result = _on_mismatch({args})",
            "    if result is not _PROCEED:",
            "        return result",
        ]

    def return_(self, line: Return) -> list[str]:
        return [return_text(line)]

    def emit(self, program: Program, header: str = "") -> Source:
        """Print a program as the source of its `make` factory."""
        bound = manifest(program)
        if self.profiled:
            bound = replace(bound, helpers=(*bound.helpers, *prof.HELPERS))
        key = memo_key(program)
        out = [f"# @generated by opgen{': ' + header if header else ''}. Do not edit.", "", ""]
        out.append("def make(kernel_ops, ops, constants, symbols, rt):")
        out += [f"    {k} = kernel_ops.{k}" for k in bound.kernels]
        out += [f'    {fallback_local(f)} = ops["{f}"]' for f in bound.fallbacks]
        out += [f'    {name} = symbols["{name}"]' for name, _ in bound.symbols]
        out += [f'    {local} = constants["{key_}"]' for local, key_ in bound.constants]
        out += [f"    {h} = rt.{h.lstrip('_')}" for h in bound.helpers]
        fused = {f.local: f for f in program.fused}
        out += [f'    {k} = rt.jit["{k}"]' for k in bound.jit if k not in fused]
        out += [t for f in program.fused for t in fused_text(f)]
        out += ["    " + t for line in program.setup for t in self.line_text(line)]
        out += [f"    {name} = None" for name in memo_names(program)]
        args = ", ".join(i.name for i in program.inputs)
        out += ["", f"    def {program.name}({args}):"]
        for i in program.inputs:
            text = "an object the graph does not read" if i.opaque else input_text(i.meta, i.size)
            out.append(f"        # {i.name}: {text}")
        locked = "_lock" in bound.helpers
        out += self._body_text(program, locked, key)
        if self.profiled:
            out += ["", "    " + prof.twin_header(program.name, args)]
            out += self._body_text(program, locked, key, twin=prof.graph_range_name(program.name, header))
        out += ["", f"    return {program.name}", ""]
        return Source("\n".join(out), bound)

    def _text(self, line: Line, ranged: bool) -> list[str]:
        """A line's statements; `ranged`: a kernel call inside its profiler range."""
        text = self.line_text(line)
        return prof.in_range(text, prof.range_name(line)) if ranged and isinstance(line, KernelCall) else text

    def _memo_text(self, program: Program, key: tuple[str, ...], ranged: bool) -> list[str]:
        """`if _memo_key != s27:` + the memo lines + the new key (set last: a failed fill is redone)."""
        if not program.memo:
            return []
        value = key[0] if len(key) == 1 else literal(tuple(Ref(k) for k in key))
        lines = [t for line in program.memo for t in self._text(line, ranged)]
        return [
            f"if _memo_key != {value}:  # size memo (passes.memo)",
            *("    " + t for t in lines),
            f"    _memo_key = {value}",
        ]

    def _body_text(
        self, program: Program, locked: bool, key: tuple[str, ...] = (), twin: str | None = None
    ) -> list[str]:
        """The function body; with persistent buffers, everything after the input check holds the lock.

        `twin`: print the profiled twin's body, in the graph's range of that name. Otherwise, with
        `profiled`, the body starts by handing the call to the twin while a profiler is on.
        """
        text = [t for line in program.body if isinstance(line, Guard) for t in self.line_text(line)]
        calls = self._calls_text(program, key, twin is not None)
        text += ["with _lock:", *("    " + t for t in calls)] if locked else calls
        if twin is not None:
            text = prof.in_range(text, twin)
        elif self.profiled:
            text = prof.dispatch_text(program.name, ", ".join(i.name for i in program.inputs)) + text
        return ["        " + t for t in _nonlocal_text(memo_names(program)) + text]

    def _calls_text(self, program: Program, key: tuple[str, ...], ranged: bool) -> list[str]:
        """Everything after the input check; the size memo runs right after the sizes are bound (the
        body's leading `SizeLet`s)."""
        rest = [line for line in program.body if not isinstance(line, Guard)]
        tail: list[str] = []
        if _returns_last_call(rest):
            *rest, last, _ = rest
            assert isinstance(last, KernelCall)
            tail = [f"return {call_expr(last)}  # {last.node}: {last.target}"]
            tail = prof.in_range(tail, prof.range_name(last)) if ranged else tail
        at = max((i + 1 for i, line in enumerate(rest) if isinstance(line, SizeLet)), default=0)
        text = [t for line in rest[:at] for t in self._text(line, ranged)] + self._memo_text(program, key, ranged)
        return text + [t for line in rest[at:] for t in self._text(line, ranged)] + tail


def emit(program: Program, header: str = "", profiled: bool = True) -> Source:
    """Print a program as the source of its `make` factory (`profiled`: with the function's profiled twin)."""
    return PythonBackend(profiled).emit(program, header)
