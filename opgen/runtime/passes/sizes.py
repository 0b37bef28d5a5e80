"""Size arithmetic once per call: every compound size expression the calls pass becomes one local.

With dynamic shapes, lowering leaves sizes as expressions over the size symbols (`4*s77`, bound
from the inputs by the `SizeLet`s at the top of the body). This pass binds each distinct compound
expression a call argument uses to a local right after those bindings (`size0 = 4*s77`) and passes
the local instead, so each is computed once per call however many calls use it. Plain symbols and
numbers are left as they are. Without this pass the expressions are printed inline (still correct).
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Arg, Constant, KernelCall, Line, Program, SizeExpr, SizeLet, map_leaves
from opgen.runtime.passes.analysis import fresh_namer
from opgen.runtime.registry import KernelRegistry


def _compound(arg: Arg, found: dict[str, SizeExpr]) -> None:
    if isinstance(arg, SizeExpr) and arg.symbols != (arg.text,):
        found.setdefault(arg.text, arg)
    elif isinstance(arg, tuple):
        for item in arg:
            _compound(item, found)


def _replace(arg: Arg, locals_: dict[str, SizeExpr]) -> Arg:
    return map_leaves(arg, lambda a: locals_.get(a.text, a) if isinstance(a, SizeExpr) else a)


def _rewrite(line: Line, locals_: dict[str, SizeExpr]) -> Line:
    if isinstance(line, KernelCall):
        kwargs = tuple((k, _replace(v, locals_)) for k, v in line.kwargs)
        return replace(line, args=tuple(_replace(a, locals_) for a in line.args), kwargs=kwargs)
    if isinstance(line, Constant):
        return replace(line, value=_replace(line.value, locals_))
    return line


def hoist_sizes(program: Program, registry: KernelRegistry) -> Program:
    found: dict[str, SizeExpr] = {}
    for line in program.body:
        if isinstance(line, KernelCall):
            _compound((*line.args, *(v for _, v in line.kwargs)), found)
        elif isinstance(line, Constant):
            _compound(line.value, found)
    if not found:
        return program
    names = fresh_namer(program, "size")
    locals_, lets = {}, []
    for text, expr in found.items():
        name = next(names)
        locals_[text] = SizeExpr(name, (name,))
        lets.append(SizeLet(name, text, expr.symbols))
    body = [_rewrite(line, locals_) for line in program.body]
    at = max((i + 1 for i, line in enumerate(body) if isinstance(line, SizeLet)), default=0)
    return replace(program, body=(*body[:at], *lets, *body[at:]))
