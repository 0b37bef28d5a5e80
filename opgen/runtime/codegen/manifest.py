"""What a program binds besides its own values: the kernels, torch ops, symbols, constants, runtime
helpers and JIT launchers it calls. Computed from the IR, the same for every backend; the artifact
stores it so that the executor can bind exactly these names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from opgen.runtime.ir import Alloc, Arg, Constant, Guard, KernelCall, Program, Return, Sym, View, program_lines
from opgen.runtime.ir.names import sym_local


@dataclass(frozen=True, slots=True)
class Manifest:
    kernels: tuple[str, ...]  # kernel_ops functions the program calls
    fallbacks: tuple[str, ...]  # ATen ops (`aten.sort.default`) it calls
    symbols: tuple[tuple[str, Sym], ...]  # (local, symbol)
    constants: tuple[tuple[str, str], ...]  # (local, key)
    helpers: tuple[str, ...]  # runtime helpers it calls (`empty_strided`, `_check`, `_lock`, ...)
    jit: tuple[str, ...] = ()  # JIT launchers it calls (fused kernels, user Triton kernels, choices)


def _symbols(args: Iterable[Arg], found: dict[str, Sym]) -> None:
    for arg in args:
        if isinstance(arg, Sym):
            found.setdefault(sym_local(arg), arg)
        elif isinstance(arg, tuple):
            _symbols(arg, found)


def manifest(program: Program) -> Manifest:
    kernels: dict[str, None] = {}
    jit: dict[str, None] = {}
    fallbacks: dict[str, None] = {}
    symbols: dict[str, Sym] = {}
    helpers: dict[str, None] = {}
    for line in (*program_lines(program), *(line for fused in program.fused for line in fused.lines)):
        match line:
            case KernelCall(kernel=kernel, fallback=fallback, jit=is_jit, args=args, kwargs=kwargs):
                (jit if is_jit else fallbacks if fallback else kernels)[kernel] = None
                _symbols(args, symbols)
                _symbols((v for _, v in kwargs), symbols)
            case Alloc(value=value):
                helpers["empty_strided"] = None
                assert value.meta is not None
                _symbols((Sym("dtype", value.meta.dtype), Sym("device", value.meta.device)), symbols)
            case View():
                helpers["as_strided"] = None
            case Constant(value=value):
                _symbols((value,), symbols)
            case Return(values=values, form=form):
                _symbols(values, symbols)
                if form == "pytree":
                    helpers["_unflatten"] = None
            case Guard(grad_mode=grad_mode):
                helpers.update(dict.fromkeys(("_check", "_on_mismatch", "_PROCEED")))
                if grad_mode:
                    helpers["_grad_enabled"] = None
    if program.memo or any(isinstance(line, Alloc) for line in program.setup):
        helpers["_lock"] = None  # persistent buffers or memo values: one call at a time
    constants = tuple((c.name, c.key) for c in program.constants)
    return Manifest(tuple(kernels), tuple(fallbacks), tuple(symbols.items()), constants, tuple(helpers), tuple(jit))
