"""The C++ backend: a `Program` -> the text of a program for opgen's prebuilt C++ executor.

The executor (csrc/opgen/executor.h documents the text) is compiled once, with the extension: it
runs a program's instructions over a file of registers, calling a generated thunk per kernel
(opgen/gen/thunks.py), the same kernel the binding calls. So nothing is compiled per graph: this
backend prints plain text, one instruction per kernel call with the graph node's name, which the
executor parses when the program is bound (`execution.cpp_executor`).

Registers: inputs are r0..r<n-1>, every other value of the body its own register; constants are
s0..s<k-1> and values the setup lines make are the statics after them. A list argument that holds
values (`cat`'s tensors) is built into a register by a `list` line before its call.

ATen fallbacks (and oneDNN's prepacking ops) go through the dispatcher, boxed (`op` lines). Static
shapes first: anything else (size symbols, Python functions, Triton and fused kernels, collectives,
the size memo) raises `CppUnsupported`, which the runtime turns into a
warning and the Python function.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from opgen.runtime.codegen.backend import Backend, Source
from opgen.runtime.codegen.manifest import manifest
from opgen.runtime.ir import (
    Alloc,
    Arg,
    Comment,
    Constant,
    Free,
    Guard,
    KernelCall,
    Program,
    Ref,
    Return,
    SizeExpr,
    SizeLet,
    Sym,
    TensorMeta,
    View,
    meta_table,
)

_SAFE = re.compile(r"[A-Za-z0-9_.:\-]")


class _ArgInfo(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def kwarg_only(self) -> bool: ...


class _OpInfo(Protocol):
    @property
    def args(self) -> Sequence[_ArgInfo]: ...
    @property
    def returns(self) -> Sequence[str]: ...
    @property
    def returns_tuple(self) -> bool: ...


class KernelRegistry(Protocol):
    """What the backend reads of `opgen.runtime.registry.KernelRegistry`: each function's argument order."""

    @property
    def by_name(self) -> Mapping[str, _OpInfo]: ...


class CppUnsupported(Exception):
    """A program the C++ backend cannot print yet; the message says what (the pipeline stores it in the artifact)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"not supported by the cpp backend yet: {what}")
        self.what = what


def escape(text: str) -> str:
    """A key or string with no spaces, quotes or `#`: other characters as %XX (UTF-8 bytes)."""
    return "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def sym_text(sym: Sym) -> str:
    match sym.kind:
        case "dtype":
            return f"torch.{sym.value}"
        case "device" | "layout" | "memory_format":
            return f"{sym.kind}({sym.value})"
        case "float":
            return sym.value  # inf, -inf, nan
    raise CppUnsupported(f"the symbol {sym.kind} {sym.value}")


def literal_text(arg: Arg) -> str:
    """A literal operand (no references)."""
    match arg:
        case None:
            return "None"
        case bool():
            return "True" if arg else "False"
        case int():
            return str(arg)
        case float():
            return repr(arg)
        case str():
            return f"'{escape(arg)}'"
        case Sym():
            return sym_text(arg)
        case SizeExpr():
            raise CppUnsupported(f"symbolic size {arg.text}")
        case tuple():
            if any(isinstance(a, tuple) for a in arg):
                raise CppUnsupported(f"a nested list argument {arg!r}")
            return "[" + ",".join(literal_text(a) for a in arg) + "]"
    raise CppUnsupported(f"the argument {arg!r}")


def ints_text(values: Iterable[object], what: str) -> str:
    items = list(values)
    if not all(type(n) is int for n in items):
        raise CppUnsupported(f"symbolic sizes of {what}")
    return "[" + ",".join(str(n) for n in items) + "]"


def meta_text(meta: TensorMeta, what: str) -> str:
    return f"{ints_text(meta.shape, what)} {ints_text(meta.stride, what)}"


def _has_ref(arg: Arg) -> bool:
    return isinstance(arg, Ref) or (isinstance(arg, tuple) and any(_has_ref(a) for a in arg))


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

    # -- naming --------------------------------------------------------------------------------
    def _define(self, name: str) -> str:
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
        if isinstance(arg, tuple) and _has_ref(arg):
            items = [self._operand(a, before) for a in arg]
            if any(isinstance(a, tuple) for a in arg):
                raise CppUnsupported(f"a nested list argument {arg!r}")
            register = self._define(f"_list{self._registers}")
            before.append(f"{register} = list {' '.join(items)}")
            return register
        return literal_text(arg)

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
            raise CppUnsupported(f"the JIT kernel {line.kernel} (node {line.node})")
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
        return [*before, f"{call}  # {line.node}: {line.target}", *([f"free {' '.join(lists)}"] if lists else [])]

    def _operator_call(self, line: KernelCall) -> list[str]:
        """An ATen fallback: `op <ns>::<name>.<overload>`, through the dispatcher (boxed)."""
        if line.kernel.startswith("py:") or line.kernel.count(".") != 2:
            raise CppUnsupported(f"the Python function {line.kernel} (node {line.node})")
        namespace, name, overload = line.kernel.split(".")
        before: list[str] = []
        ops = [self._operand(a, before) for a in line.args]
        ops += [f"{k}={self._operand(v, before)}" for k, v in line.kwargs]
        lists = [text.split(" ", 1)[0] for text in before]
        call = f"{self._outputs(line)} = op {namespace}::{name}.{overload} {' '.join(ops)}".rstrip()
        return [*before, f"{call}  # {line.node}: {line.target}", *([f"free {' '.join(lists)}"] if lists else [])]

    def _outputs(self, line: KernelCall) -> str:
        outs = [self._define(v.name) if v is not None else "_" for v in line.outputs] or ["_"]
        return ", ".join(outs) + ("," if line.unpack and len(outs) == 1 else "")

    def alloc(self, line: Alloc) -> list[str]:
        meta = line.value.meta
        assert meta is not None, f"Alloc of {line.value.name} has no meta"
        what = f"the buffer {line.value.name}"
        dtype, device = sym_text(Sym("dtype", meta.dtype)), sym_text(Sym("device", meta.device))
        return [f"{self._define(line.value.name)} = empty_strided {meta_text(meta, what)} {dtype} {device}"]

    def view(self, line: View) -> list[str]:
        meta = line.value.meta
        assert meta is not None, f"View {line.value.name} has no meta"
        what = f"the view {line.value.name}"
        if type(meta.offset) is not int:
            raise CppUnsupported(f"symbolic offset of {what}")
        source = self._ref(line.source)
        comment = f"  # {line.node}" if line.node else ""
        return [f"{self._define(line.value.name)} = as_strided {source} {meta_text(meta, what)} {meta.offset}{comment}"]

    def free(self, line: Free) -> list[str]:
        names = [r for n in line.names if (r := self._names.get(n, "")).startswith("r") and r not in self._inputs]
        return [f"free {' '.join(names)}"] if names and not self._in_setup else []

    def constant(self, line: Constant) -> list[str]:
        self._literals[line.name] = line.value
        return []

    def size_let(self, line: SizeLet) -> list[str]:
        raise CppUnsupported(f"the size symbol {line.name} = {line.text}")

    def comment(self, line: Comment) -> list[str]:
        return [f"# {t}" for t in line.text.splitlines()]

    def guard(self, line: Guard) -> list[str]:
        return [f"guard {' '.join(self._ref(n) for n in line.inputs)}" + (" grad" if line.grad_mode else "")]

    def return_(self, line: Return) -> list[str]:
        before: list[str] = []
        values = [self._operand(v, before) for v in line.values]
        return [*before, f"return {line.form} {' '.join(values)}".rstrip()]

    # -- the program ---------------------------------------------------------------------------
    def emit(self, program: Program, header: str = "") -> Source:
        _check_supported(program)
        self._reset()  # a fresh register file per program
        self._metas = meta_table(program)
        self._inputs = {self._define(i.name) for i in program.inputs}  # never freed: the caller's tensors
        inputs = [
            f"input {self._names[i.name]} {escape(i.name)} {i.meta.dtype} {i.meta.device} {meta_text(i.meta, i.name)}"
            for i in program.inputs
        ]
        self._in_setup = True
        constants = [f"constant {self._define(c.name)} {escape(c.key)}" for c in program.constants]
        setup = [t for line in program.setup for t in self.line_text(line)]
        self._in_setup = False
        body = [t for line in program.body for t in self.line_text(line)]
        out = [f"# @generated by opgen{': ' + header if header else ''}. Do not edit."]
        out.append(f"program {program.name} registers {max(self._registers, 1)} statics {self._statics}")
        out += inputs + constants + ["setup:", *("  " + t for t in setup), "body:", *("  " + t for t in body), ""]
        return Source("\n".join(out), manifest(program))


def _check_supported(program: Program) -> None:
    for i in program.inputs:
        if i.size is not None:
            raise CppUnsupported(f"the size input {i.name} (dynamic shapes)")
        if i.opaque:
            raise CppUnsupported(f"the opaque input {i.name}")
        if not i.meta.is_static:
            raise CppUnsupported(f"symbolic sizes of the input {i.name} (dynamic shapes)")
    extras = {
        "the size memo (dynamic shapes)": program.memo,
        "Triton kernels": program.jit_kernels,
        "kernel choices made on the first call": program.choices,
        "fused Triton kernels": program.fused,
        "collectives": program.collectives,
    }
    for what, present in extras.items():
        if present:
            raise CppUnsupported(what)


def emit(program: Program, registry: KernelRegistry, header: str = "") -> Source:
    """The executor's program text for `program` (CppUnsupported where it cannot be printed yet)."""
    return CppBackend(registry).emit(program, header)
