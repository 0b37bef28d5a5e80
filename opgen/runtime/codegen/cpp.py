"""The C++ backend: a `Program` -> the text of a program for opgen's prebuilt C++ executor.

The text's grammar is docs/cpp-program.md: this module prints it (with cpp_literals, cpp_sizes and
cpp_recycle), the executor's parser (csrc/opgen/exec/executor_parse.cpp) reads it, and its printer
(`_C.reprint_program`) writes a parsed program back; tests/runtime/test_cpp_program_roundtrip.py
holds the three to one form. A change to what is printed here is a change to that page.

The executor is compiled once, with the extension: it runs a program's instructions over a file of
registers, calling a generated thunk per kernel (opgen/gen/thunks.py), the same kernel the binding
calls. So nothing is compiled per graph: this backend prints plain text, one instruction per kernel
call with the graph node's name, which the executor parses when the program is bound
(`backends.cpp`).

Registers: inputs are r0..r<n-1>, every other value of the body its own register; constants are
s0..s<k-1> and values the setup lines make are the statics after them. A list argument that holds
values (`cat`'s tensors) is built into a register by a `list` line before its call.

ATen fallbacks (and oneDNN's prepacking ops) go through the dispatcher, boxed (`op` lines).

Externs: what the generated Python calls through a callable bound at load time (Triton and fused
kernels, kernel choices, collectives, `py:` functions) is an `extern` of the program, called by a
`call` line and bound by the same local name (`backends.cpp`): a Triton launcher is
launched from C++, anything else called with the GIL (a dtype, layout or memory format literal
reaches it as torch's object, as from the Python function). A fused kernel's call also gets two
`alternative` sections after the body, one pair per call (a kernel may serve several): its Triton
launch (outputs allocated, then its launcher, the extern `<local>.launcher`) and its ATen calls.
Once the first call has picked, the executor puts the pick's lines in place of the call, and no
Python runs for it again.

Dynamic shapes: inputs print `?` for symbolic sizes (the runtime's input check binds them), size
inputs print as `int`, size symbols are registers (`size` reads an input's dimension, `sym`
computes an expression: `codegen.cpp_sizes`), and shapes, strides and arguments that hold them are
lists built per call; the size memo's lines run on every call, right after the sizes are bound.

A package, which runs without Python, has no externs and static shapes only. What cannot be printed
(a list of dtypes as an extern's argument, a size expression with other functions than min and
max) raises `CppUnsupported`, which the runtime turns into a warning and the Python function.
"""

from __future__ import annotations

import re

from opgen.runtime.codegen.backend import Backend, Source
from opgen.runtime.codegen.cpp_literals import CppUnsupported, escape, literal_text, sym_text
from opgen.runtime.codegen.cpp_recycle import recyclable
from opgen.runtime.codegen.cpp_sizes import SizeTextError, input_shape_text, postfix
from opgen.runtime.codegen.manifest import manifest
from opgen.runtime.codegen.registry_view import KernelRegistry
from opgen.runtime.ir import (
    Alloc,
    Arg,
    Comment,
    Constant,
    Free,
    FusedKernel,
    Guard,
    Input,
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
    meta_table,
)
from opgen.runtime.ir.names import fallback_local


def _has_ref(arg: Arg) -> bool:
    """Whether an argument reads a register: a value, or a size known per call."""
    return isinstance(arg, Ref | SizeExpr) or (isinstance(arg, tuple) and any(_has_ref(a) for a in arg))


class CppBackend(Backend):
    """The executor's program text; see the module docstring. `registry` orders each call's arguments."""

    def __init__(self, registry: KernelRegistry) -> None:
        self.registry = registry
        self._reset()

    def _reset(self) -> None:
        self._names: dict[str, str] = {}  # value name -> r<k> / s<k>
        self._literals: dict[str, Arg] = {}  # Constant lines: name -> value
        self._metas: dict[str, TensorMeta] = {}
        self._registers = 0
        self._statics = 0
        self._in_setup = False
        self._inputs: set[str] = set()
        self._externs: dict[str, None] = {}  # callables bound at load time, in order of first call
        self._fused: dict[str, FusedKernel] = {}
        self._alternatives: list[str] = []  # the `alternative` sections, printed after the body
        self._reuse = False  # printing an alternative: names defined already keep their registers
        self._fresh: list[str] = []  # registers an alternative defines besides those
        self._recycle: dict[str, tuple[int, KernelCall]] = {}  # returned values the caller's dropped results take

    # -- naming --------------------------------------------------------------------------------
    def _define(self, name: str) -> str:
        if self._reuse:
            if name not in self._names:
                self._names[name] = f"r{self._registers}"
                self._registers += 1
                self._fresh.append(self._names[name])
            return self._names[name]
        if self._in_setup:
            self._names[name] = f"s{self._statics}"
            self._statics += 1
        else:
            self._names[name] = f"r{self._registers}"
            self._registers += 1
        return self._names[name]

    def _ref(self, name: str) -> str:
        if name in self._literals:
            return self._operand(self._literals[name], [])
        if name not in self._names:
            raise CppUnsupported(f"a reference to {name}, which nothing defines before it")
        return self._names[name]

    def _operand(self, arg: Arg, before: list[str]) -> str:
        """An operand's text; a list holding references is built by a `list` line appended to `before`."""
        if isinstance(arg, Ref):
            return self._ref(arg.name)
        if isinstance(arg, SizeExpr):
            return self._size(arg, before)
        if isinstance(arg, tuple) and _has_ref(arg):
            items = [self._operand(a, before) for a in arg]
            if any(isinstance(a, tuple) for a in arg):
                raise CppUnsupported(f"a nested list argument {arg!r}")
            register = self._define(f"_list{self._registers}")
            before.append(f"{register} = list {' '.join(items)}")
            return register
        return literal_text(arg)

    def _size(self, expr: SizeExpr, before: list[str]) -> str:
        """A size's register: a symbol's (or a hoisted size's), else one a `sym` line appended to `before` computes."""
        if expr.text in self._names:
            return self._names[expr.text]
        program = self._postfix(expr.text)
        register = self._define(f"_size{self._registers}")
        before.append(f"{register} = sym {program}  # {expr.text}")
        return register

    def _postfix(self, text: str) -> str:
        """A size expression as a `sym` line's operands and operators (`CppUnsupported` where it cannot be)."""
        try:
            return " ".join(postfix(text, self._symbol))
        except SizeTextError as exc:
            raise CppUnsupported(str(exc)) from exc

    def _symbol(self, name: str) -> str:
        if name not in self._names:
            raise CppUnsupported(f"the size symbol {name}, which nothing binds before it is read")
        return self._names[name]

    def _shape(self, meta: TensorMeta, before: list[str]) -> str:
        """`<sizes> <strides>`: literal lists, or registers of lists built per call where symbolic."""
        return f"{self._operand(tuple(meta.shape), before)} {self._operand(tuple(meta.stride), before)}"

    def _device(self, line: KernelCall) -> str:
        for arg in (*line.args, *(v for _, v in line.kwargs)):
            for item in arg if isinstance(arg, tuple) else (arg,):
                if isinstance(item, Ref) and item.name in self._metas:
                    return self._metas[item.name].device.split(":")[0]
        device = dict(line.kwargs).get("device")
        return device.value.split(":")[0] if isinstance(device, Sym) else "cpu"

    # -- lines ---------------------------------------------------------------------------------
    def kernel_call(self, line: KernelCall) -> list[str]:
        if line.fallback:
            return self._operator_call(line)
        if line.jit:
            text = self._extern_call(line, line.kernel)
            if line.kernel in self._fused:
                self._alternatives += self._fused_alternatives(self._fused[line.kernel], line)
            return text
        info = self.registry.by_name.get(line.kernel)
        if info is None:
            raise CppUnsupported(f"kernel_ops.{line.kernel}, which the registry lacks (node {line.node})")
        if (len(info.returns) > 1 or info.returns_tuple) and not line.unpack and any(line.outputs):
            raise CppUnsupported(f"a tuple result kept whole (node {line.node})")
        positional = [a.name for a in info.args if not a.kwarg_only]
        values: dict[str, Arg] = dict(zip(positional, line.args, strict=False))
        values.update(line.kwargs)
        before: list[str] = []
        ops = [self._operand(values[a.name], before) if a.name in values else "_" for a in info.args]
        while ops and ops[-1] == "_":
            ops.pop()
        lists = [text.split(" ", 1)[0] for text in before]
        call = f"{self._outputs(line)} = {line.kernel}.{self._device(line)} {' '.join(ops)}".rstrip()
        freed = [f"free {' '.join(lists)}"] if lists else []
        return [*before, f"{call}  # {line.node}: {line.target}", *self._recycle_line(line), *freed]

    def _recycle_line(self, line: KernelCall) -> list[str]:
        """`recycle <k> <out= call>` after the line that makes return value k (`codegen.cpp_recycle`)."""
        out = line.outputs[0] if len(line.outputs) == 1 else None
        if out is None or self._in_setup or self._reuse or out.name not in self._recycle:
            return []
        k, form = self._recycle[out.name]
        text = self.kernel_call(form)
        return [f"recycle {k} {text[0]}"] if len(text) == 1 else []  # not where it builds a list first

    def _extern_call(self, line: KernelCall, callee: str) -> list[str]:
        """`call <callee> <positional...> <name>=<operand>...`: a callable the program is bound to by name."""
        for arg in (*line.args, *(v for _, v in line.kwargs)):  # a list's dtypes would reach it as ints
            for item in arg if isinstance(arg, tuple) else ():
                if isinstance(item, Sym) and item.kind not in ("device", "float"):
                    raise CppUnsupported(f"a list of {item.kind}s as an argument of {callee} (node {line.node})")
        self._externs[callee] = None
        return self._keyword_call(line, f"call {callee}")

    def _keyword_call(self, line: KernelCall, what: str) -> list[str]:
        """`<outputs> = <what> <positional...> <name>=<operand>...`, after the `list` lines its operands need."""
        before: list[str] = []
        ops = [self._operand(a, before) for a in line.args]
        ops += [f"{k}={self._operand(v, before)}" for k, v in line.kwargs]
        lists = [text.split(" ", 1)[0] for text in before]
        call = f"{self._outputs(line)} = {what} {' '.join(ops)}".rstrip()
        return [*before, f"{call}  # {line.node}: {line.target}", *([f"free {' '.join(lists)}"] if lists else [])]

    def _fused_alternatives(self, spec: FusedKernel, call: KernelCall) -> list[str]:
        """This call's two alternatives: allocate its outputs and launch the kernel, or its ATen calls.
        The kernel's lines name its own parameters (a kernel may serve several calls: a model's
        layers), bound here to this call's registers; its other values get fresh registers."""
        self._externs[f"{spec.local}.launcher"] = None
        names, metas = dict(self._names), dict(self._metas)
        self._reuse, self._fresh = True, []
        try:
            operands = [self._operand(a, []) for a in call.args]
            results = [names[out.name] if out is not None else None for out in call.outputs]
            for param, arg, register in zip(spec.inputs, call.args, operands, strict=True):
                self._names[param] = register
                if isinstance(arg, Ref) and arg.name in metas:
                    self._metas[param] = metas[arg.name]
            defined = {v.name for line in spec.lines for v in line.outputs if v is not None}
            for name in defined - set(spec.inputs):
                self._names.pop(name, None)
            for value, result in zip(spec.outputs, results, strict=True):
                self._names[value.name] = result or self._define(value.name)
            self._metas.update((v.name, v.meta) for line in spec.lines for v in line.outputs if v and v.meta)
            outputs = [self._names[v.name] for v in spec.outputs]
            triton = [self.alloc(Alloc(v))[0] for v in spec.outputs]
            launch = f"_ = call {spec.local}.launcher {' '.join(operands + outputs)}"
            triton.append(f"{launch}  # {call.node}: {call.target}")  # the call's profiler range
            aten = [t for line in spec.lines for t in self.kernel_call(line)]
            if self._fresh:
                aten.append(f"free {' '.join(self._fresh)}")
        finally:
            self._reuse = False
            self._names, self._metas = names, metas
        return [
            f"alternative {spec.local} triton",
            *("  " + t for t in triton),
            f"alternative {spec.local} aten",
            *("  " + t for t in aten),
        ]

    def _operator_call(self, line: KernelCall) -> list[str]:
        """An ATen fallback: `op <ns>::<name>.<overload>`, through the dispatcher (boxed)."""
        if line.kernel.startswith("py:"):
            return self._extern_call(line, fallback_local(line.kernel))
        if line.kernel.count(".") != 2:
            raise CppUnsupported(f"the operator {line.kernel} (node {line.node})")
        namespace, name, overload = line.kernel.split(".")
        return self._keyword_call(line, f"op {namespace}::{name}.{overload}")

    def _outputs(self, line: KernelCall) -> str:
        outs = [self._define(v.name) if v is not None else "_" for v in line.outputs] or ["_"]
        return ", ".join(outs) + ("," if line.unpack and len(outs) == 1 else "")

    def alloc(self, line: Alloc) -> list[str]:
        meta = line.value.meta
        assert meta is not None, f"Alloc of {line.value.name} has no meta"
        dtype, device = sym_text(Sym("dtype", meta.dtype)), sym_text(Sym("device", meta.device))
        before: list[str] = []
        shape = self._shape(meta, before)
        return [*before, f"{self._define(line.value.name)} = empty_strided {shape} {dtype} {device}"]

    def view(self, line: View) -> list[str]:
        meta = line.value.meta
        assert meta is not None, f"View {line.value.name} has no meta"
        source = self._ref(line.source)
        before: list[str] = []
        shape, offset = self._shape(meta, before), self._operand(meta.offset, before)
        comment = f"  # {line.node}" if line.node else ""
        return [*before, f"{self._define(line.value.name)} = as_strided {source} {shape} {offset}{comment}"]

    def free(self, line: Free) -> list[str]:
        names = [r for n in line.names if (r := self._names.get(n, "")).startswith("r") and r not in self._inputs]
        return [f"free {' '.join(names)}"] if names and not self._in_setup else []

    def constant(self, line: Constant) -> list[str]:
        self._literals[line.name] = line.value
        return []

    def size_let(self, line: SizeLet) -> list[str]:
        """`s77 = x.shape[0]` -> `size` of an input's dimension; other sizes -> `sym`."""
        comment = f"  # {line.name} = {line.text}"
        dim = re.fullmatch(r"(\w+)\.shape\[(\d+)\]", line.text)
        if dim is not None and dim.group(1) in self._names:
            return [f"{self._define(line.name)} = size {self._names[dim.group(1)]} {dim.group(2)}{comment}"]
        return [f"{self._define(line.name)} = sym {self._postfix(line.text)}{comment}"]

    def comment(self, line: Comment) -> list[str]:
        return [f"# {t}" for t in line.text.splitlines()]

    def guard(self, line: Guard) -> list[str]:
        return [f"guard {' '.join(self._ref(n) for n in line.inputs)}" + (" grad" if line.grad_mode else "")]

    def return_(self, line: Return) -> list[str]:
        before: list[str] = []
        values = [self._operand(v, before) for v in line.values]
        return [*before, f"return {line.form} {' '.join(values)}".rstrip()]

    def _input_text(self, i: Input) -> str:
        register = self._names[i.name]
        if i.size is not None:  # an int: the symbol it names reads its register
            self._names.setdefault(i.size.text, register)
            return f"input {register} {escape(i.name)} int"
        if i.opaque:  # an object the program never reads (a DTensor's spec): its register stays None
            return f"input {register} {escape(i.name)} opaque"
        return f"input {register} {escape(i.name)} {i.meta.dtype} {i.meta.device} {input_shape_text(i.meta)}"

    # -- the program ---------------------------------------------------------------------------
    def emit(self, program: Program, header: str = "") -> Source:
        self._reset()  # a fresh register file per program
        self._recycle = recyclable(program, self.registry)
        self._metas = meta_table(program)
        self._fused = {f.local: f for f in program.fused if f.lines}
        self._inputs = {self._define(i.name) for i in program.inputs}  # never freed: the caller's tensors
        inputs = [self._input_text(i) for i in program.inputs]
        self._in_setup = True
        constants = [f"constant {self._define(c.name)} {escape(c.key)}" for c in program.constants]
        setup = [t for line in program.setup for t in self.line_text(line)]
        self._in_setup = False
        body = [t for line in _with_memo(program) for t in self.line_text(line)]
        externs = [f"extern {name}" for name in self._externs]
        made = [v.name for line in program.setup for v in defs(line) if self._names.get(v.name, "")[:1] == "s"]
        shared = [f"shared {self._names[name]} {name}" for name in made]  # the Python function's locals
        out = [f"# @generated by opgen{': ' + header if header else ''}. Do not edit."]
        out.append(f"program {program.name} registers {max(self._registers, 1)} statics {self._statics}")
        out += inputs + constants + externs + shared
        out += ["setup:", *("  " + t for t in setup), "body:", *("  " + t for t in body)]
        out += [*self._alternatives, ""]
        return Source("\n".join(out), manifest(program))


def _with_memo(program: Program) -> tuple[Line, ...]:
    """The body with the size memo's lines right after the leading size bindings (as the Python
    backend places them; here they run on every call)."""
    body = program.body
    at = max((i + 1 for i, line in enumerate(body) if isinstance(line, SizeLet)), default=0)
    return (*body[:at], *program.memo, *body[at:])


def emit(program: Program, registry: KernelRegistry, header: str = "") -> Source:
    """The executor's program text for `program` (CppUnsupported where it cannot be printed yet)."""
    return CppBackend(registry).emit(program, header)
