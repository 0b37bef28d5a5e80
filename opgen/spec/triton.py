"""Validate the `triton:` section of a spec op into a `TritonKernel`, reporting every problem at once.

    - func: triton_add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
      triton:
        kernel: opgen.jit.library:add_kernel
        args: {x_ptr: self, y_ptr: other, out_ptr: out, n_elements: numel(self), alpha: alpha}
        outputs: {out: empty_like(self)}
        grid: [cdiv(n_elements, BLOCK)]
        configs: [{BLOCK: 1024, num_warps: 4}, {BLOCK: 4096, num_warps: 8}]

Nothing is imported here: the kernel's module is named, not loaded (that happens at run time).
Expressions are parsed by `opgen.jit.expr`, the language the launcher evaluates.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opgen.jit import expr as jx
from opgen.spec.model import Arg, Schema, TritonArg, TritonConfig, TritonKernel, TritonOutput
from opgen.spec.problems import unknown_key

TRITON_KEYS = ("kernel", "args", "outputs", "grid", "configs", "candidate_for", "contiguous", "same_shape")
REQUIRED_KEYS = ("kernel", "args", "grid", "configs")
LAUNCH_OPTIONS = ("num_warps", "num_stages")
# Schema types a kernel parameter may be bound to by name (Scalar is passed as a float).
PASSABLE = ("Tensor", "int", "SymInt", "float", "bool", "Scalar")
# torch dtype names an output may be allocated with -> at::ScalarType.
DTYPES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int8": "Char",
    "uint8": "Byte", "int16": "Short", "int32": "Int", "int64": "Long", "bool": "Bool",
}  # fmt: skip
_KERNEL = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_OVERLOAD = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]\w*\Z")
_ALLOC = re.compile(r"^empty_like\(\s*(?P<like>\w+)\s*(?:,\s*dtype\s*=\s*(?P<dtype>\w+)\s*)?\)\Z")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

Report = Callable[[int, str], None]  # (line, message): one problem of this op


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What the checks of one `triton:` section share; `found` counts the problems reported."""

    schema: Schema
    report: Report
    line: int  # the `triton:` key's line
    lines: dict[str, int]  # the line of each key inside the section
    found: list[int]

    def at(self, key: str) -> int:
        return self.lines.get(key, self.line)

    def problem(self, key: str, message: str) -> None:
        self.problem_at(self.at(key), message)

    def problem_at(self, line: int, message: str) -> None:
        self.found.append(1)
        self.report(line, f"triton: {message}")

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.schema.args if a.name == name), None)


def allocated_returns(schema: Schema) -> int:
    """How many results the binding allocates: those that do not return a written argument."""
    return sum(1 for r in schema.returns if r.alias is None or not r.alias.is_write)


def triton_kernel(raw: Any, line: int, schema: Schema, report: Report) -> TritonKernel | None:
    """The validated section, or None after reporting each problem through `report`."""
    if not isinstance(raw, dict):
        report(line, "'triton' must be a mapping with kernel, args, grid and configs")
        return None
    ctx = _Ctx(schema, report, line, {str(k): v for k, v in getattr(raw, "lines", {}).items()}, [])
    kernel = _sections(raw, ctx)
    return kernel if not ctx.found else None


def _sections(raw: dict[str, Any], ctx: _Ctx) -> TritonKernel | None:
    for key in raw:
        if key not in TRITON_KEYS:
            ctx.problem(str(key), unknown_key(key, TRITON_KEYS))
    for key in REQUIRED_KEYS:
        if key not in raw:
            ctx.problem(key, f"missing key '{key}'")
    if not _check_schema(ctx):
        return None
    outputs = _outputs(raw.get("outputs"), "outputs" in raw, ctx)
    # Names as declared, valid or not, so that one mistake is not reported again where it is used.
    output_names = {str(k) for k in raw["outputs"]} if isinstance(raw.get("outputs"), dict) else set()
    params = {str(k) for k in raw["args"]} if isinstance(raw.get("args"), dict) else None
    args = _args(raw["args"], output_names, ctx) if "args" in raw else ()
    configs = _configs(raw["configs"], params or set(), ctx) if "configs" in raw else ()
    grid = _grid(raw["grid"], args, params, configs, ctx) if "grid" in raw else ()
    kernel = raw.get("kernel")
    if "kernel" in raw and not (isinstance(kernel, str) and _KERNEL.match(kernel)):
        ctx.problem("kernel", f"kernel {kernel!r} is not of the form 'module.path:function' (a @triton.jit function)")
    candidate = raw.get("candidate_for")
    if candidate is not None and not (isinstance(candidate, str) and _OVERLOAD.match(candidate)):
        ctx.problem(
            "candidate_for",
            f"candidate_for {candidate!r} is not an op overload like 'aten.add.Tensor' or 'mylib.scaled_add.default'",
        )
    contiguous = _tensor_list(raw, "contiguous", ctx)
    same_shape = _tensor_list(raw, "same_shape", ctx)
    _check_outputs_used(outputs, args, ctx)
    return TritonKernel(str(kernel), args, outputs, grid, configs, candidate, contiguous, same_shape)


def _check_schema(ctx: _Ctx) -> bool:
    """Triton ops return tensors they allocate, or written arguments; never views or lists."""
    before = len(ctx.found)
    for ret in ctx.schema.returns:
        if ret.type.base != "Tensor":
            ctx.problem("", f"a Triton op returns tensors only, not '{ret.type}'")
        elif ret.type.is_list:
            ctx.problem("", "a Triton op cannot return a Tensor[]")
        elif ret.alias is not None and not ret.alias.is_write:
            ctx.problem("", f"a Triton op cannot return a view ('Tensor{ret.alias}')")
    if 0 < allocated_returns(ctx.schema) < len(ctx.schema.returns):
        ctx.problem("", "returns must all be written arguments or all be allocated by 'outputs'")
    return len(ctx.found) == before


def _line(raw: Any, key: object, default: int) -> int:
    """The line of `key` inside a mapping the loader read (`default` where it is not known)."""
    return int(getattr(raw, "lines", {}).get(str(key), default))


def _outputs(raw: Any, present: bool, ctx: _Ctx) -> tuple[TritonOutput, ...]:
    wanted = allocated_returns(ctx.schema)
    if wanted == 0:
        if present:
            ctx.problem("outputs", "the op returns written arguments, so it allocates nothing: remove 'outputs'")
        return ()
    if not present:
        ctx.problem("", f"missing key 'outputs' (the op returns {wanted} tensor(s) for the binding to allocate)")
        return ()
    if not isinstance(raw, dict) or not raw:
        ctx.problem(
            "outputs", "'outputs' must map each returned tensor to empty_like(t) or empty_like(t, dtype=<dtype>)"
        )
        return ()
    if len(raw) != wanted:
        ctx.problem("outputs", f"'outputs' allocates {len(raw)} tensor(s), but the schema returns {wanted}")
    found = [_output(name, text, ret.name, _line(raw, name, ctx.at("outputs")), ctx)
             for (name, text), ret in zip(raw.items(), ctx.schema.returns, strict=False)]  # fmt: skip
    return tuple(o for o in found if o is not None)


def _output(name: Any, text: Any, return_name: str | None, line: int, ctx: _Ctx) -> TritonOutput | None:
    before = len(ctx.found)
    if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
        ctx.problem_at(line, f"output name {name!r} is not a valid identifier")
    elif return_name is not None and name != return_name:
        ctx.problem_at(line, f"output '{name}' must be named '{return_name}', as the schema's return is")
    elif ctx.arg(name) is not None:
        ctx.problem_at(line, f"output '{name}' has the name of a schema argument")
    match = _ALLOC.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        shown = f"output {name!r}: {text!r} is not empty_like(t) or empty_like(t, dtype=<dtype>)"
        ctx.problem_at(line, shown + _comma_hint(text))
        return None
    like, dtype = match["like"], match["dtype"]
    arg = ctx.arg(like)
    if arg is None or str(arg.type) != "Tensor":
        ctx.problem_at(line, f"output {name!r}: empty_like({like}): '{like}' is not a Tensor argument of the schema")
    if dtype is not None and dtype not in DTYPES:
        ctx.problem_at(line, f"output {name!r}: unknown dtype '{dtype}' (allowed: {', '.join(DTYPES)})")
    return TritonOutput(name, like, dtype) if len(ctx.found) == before else None


def _args(raw: Any, outputs: set[str], ctx: _Ctx) -> tuple[TritonArg, ...]:
    if not isinstance(raw, dict) or not raw:
        ctx.problem("args", "'args' must map each runtime parameter of the kernel, in its order, to an expression")
        return ()
    found = []
    for param, value in raw.items():
        line = _line(raw, param, ctx.at("args"))
        if not isinstance(param, str) or not _IDENT.match(param) or keyword.iskeyword(param):
            ctx.problem_at(line, f"args: parameter name {param!r} is not a valid identifier")
            continue
        try:
            parsed = jx.parse(value)
        except jx.ExprError as exc:
            ctx.problem_at(line, f"args: '{param}': {exc}{_comma_hint(value)}")
            continue
        before = len(ctx.found)
        _check_int64(f"args: '{param}'", parsed, lambda msg, line=line: ctx.problem_at(line, msg))
        _check_arg_expr(param, parsed, outputs, line, ctx)
        if len(ctx.found) == before:
            found.append(TritonArg(param, str(value).strip(), parsed))
    return tuple(found)


def _check_arg_expr(param: str, value: jx.Expr, outputs: set[str], line: int, ctx: _Ctx) -> None:
    """A bare name passes an argument or output as it is; anything else computes an int."""
    known = list(dict.fromkeys([*(a.name for a in ctx.schema.args), *sorted(outputs)]))
    names = [value.name] if isinstance(value, jx.Name) else [*jx.names(value), *jx.tensors(value)]
    for name in dict.fromkeys(names):
        if name not in known:
            ctx.problem_at(line, f"args: '{param}': unknown name '{name}' (known: {', '.join(known)})")
    if isinstance(value, jx.Name):
        arg = ctx.arg(value.name)
        if arg is not None and (arg.type.is_list or arg.type.base not in PASSABLE):
            allowed = "Tensor, int, SymInt, float, bool, Scalar, each also optional"
            ctx.problem_at(line, f"args: '{param}': arg '{arg.name}' of type '{arg.type}' cannot be passed ({allowed})")
        return
    for name in dict.fromkeys(jx.names(value)):
        arg = ctx.arg(name)
        if arg is not None and str(arg.type) not in ("int", "SymInt"):
            ctx.problem_at(line, f"args: '{param}': '{name}' is a '{arg.type}'; expressions compute with int arguments")
        elif name in outputs:
            ctx.problem_at(line, f"args: '{param}': '{name}' is a tensor; expressions compute with int arguments")
    for name in dict.fromkeys(jx.tensors(value)):
        arg = ctx.arg(name)
        if arg is not None and str(arg.type) != "Tensor":
            ctx.problem_at(line, f"args: '{param}': numel/size/stride need a Tensor, and '{name}' is a '{arg.type}'")


def _configs(raw: Any, params: set[str], ctx: _Ctx) -> tuple[TritonConfig, ...]:
    if not isinstance(raw, list) or not raw:
        ctx.problem("configs", "'configs' must be a non-empty list of mappings (constexprs, num_warps, num_stages)")
        return ()
    found = [_config(i, item, params, ctx) for i, item in enumerate(raw)]
    return tuple(c for c in found if c is not None) if all(found) else ()


def _config(index: int, raw: Any, params: set[str], ctx: _Ctx) -> TritonConfig | None:
    where = f"configs[{index}]"
    line = getattr(raw, "line", ctx.at("configs"))
    if not isinstance(raw, dict):
        ctx.problem_at(line, f"{where} must be a mapping, not {raw!r}")
        return None
    before = len(ctx.found)
    warps, stages = raw.get("num_warps", 4), raw.get("num_stages", 3)
    if not _is_int(warps) or not (1 <= warps <= 32 and warps & (warps - 1) == 0):
        ctx.problem_at(line, f"{where}: num_warps must be a power of two from 1 to 32, not {warps!r}")
    if not _is_int(stages) or stages < 1:
        ctx.problem_at(line, f"{where}: num_stages must be a positive int, not {stages!r}")
    meta = {k: v for k, v in raw.items() if k not in LAUNCH_OPTIONS}
    for key, value in meta.items():
        if not isinstance(key, str) or not _IDENT.match(key):
            ctx.problem_at(line, f"{where}: constexpr name {key!r} is not a valid identifier")
        elif key in params:
            ctx.problem_at(line, f"{where}: '{key}' is a runtime parameter (a key of 'args'), not a constexpr")
        elif not isinstance(value, int | float | str):  # bool is an int
            ctx.problem_at(line, f"{where}: constexpr '{key}' must be an int, float, bool or string, not {value!r}")
    if len(ctx.found) > before:
        return None
    return TritonConfig(tuple(meta.items()), warps, stages)


def _check_int64(where: str, value: jx.Expr, problem: Callable[[str], None]) -> None:
    """Literals become C++ int64 constants (and launcher program words): they must fit."""
    match value:
        case jx.Const(value=number) | jx.TensorProp(dim=number) if not -(2**63) <= number < 2**63:
            problem(f"{where}: {number} does not fit in a 64-bit int")
        case jx.BinOp(left=left, right=right):
            _check_int64(where, left, problem)
            _check_int64(where, right, problem)
        case jx.Neg(operand=operand):
            _check_int64(where, operand, problem)


def _comma_hint(text: object) -> str:
    """YAML splits an unquoted `[cdiv(n, BLOCK)]` at its comma: say so where parentheses do not balance."""
    if isinstance(text, str) and text.count("(") != text.count(")"):
        return " (in a YAML flow list or mapping, quote an expression that holds a comma)"
    return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _grid(
    raw: Any, args: tuple[TritonArg, ...], params: set[str] | None, configs: tuple[TritonConfig, ...], ctx: _Ctx
) -> tuple[str, ...]:
    """`params`: the declared parameter names (None: `args` is unreadable, so names go unchecked)."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= 3:
        ctx.problem("grid", f"'grid' must be a list of 1 to 3 expressions, not {raw!r}")
        return ()
    tensors = {a.param for a in args if isinstance(a.value, jx.Name) and _is_tensor(a.value.name, ctx)}
    metas = [dict(c.meta) for c in configs]
    common = (
        {k for k, v in metas[0].items() if _is_int(v) and all(_is_int(m.get(k)) for m in metas)} if metas else set()
    )
    texts = []
    for index, item in enumerate(raw):
        try:
            value = jx.parse(item)
        except jx.ExprError as exc:
            ctx.problem("grid", f"grid[{index}]: {exc}{_comma_hint(item)}")
            continue
        texts.append(str(item).strip())
        _check_int64(f"grid[{index}]", value, lambda msg: ctx.problem("grid", msg))
        for name in dict.fromkeys(jx.names(value)):
            if name in common or (params is not None and name in params) or not configs:
                continue
            if all(name in m for m in metas):
                ctx.problem("grid", f"grid[{index}]: constexpr '{name}' is not an int in every config")
            elif params is not None:
                ctx.problem(
                    "grid",
                    f"grid[{index}]: '{name}' is neither a kernel parameter (a key of 'args') "
                    "nor an int constexpr of every config",
                )
        for name in dict.fromkeys(jx.tensors(value)):
            if name not in tensors:
                ctx.problem(
                    "grid", f"grid[{index}]: numel/size/stride need a tensor parameter, and '{name}' is not one"
                )
    return tuple(texts)


def _is_tensor(name: str, ctx: _Ctx) -> bool:
    """Whether a (known) name passed to the kernel is a tensor: a Tensor argument, or an output."""
    arg = ctx.arg(name)
    return str(arg.type) == "Tensor" if arg is not None else True  # not an argument: an output


def _tensor_list(raw: dict[str, Any], key: str, ctx: _Ctx) -> tuple[str, ...]:
    value = raw.get(key, [])
    names = value if isinstance(value, list) else [value]
    bad = [n for n in names if not isinstance(n, str) or ctx.arg(n) is None or str(ctx.arg(n).type) != "Tensor"]  # type: ignore[union-attr]
    if bad or (key == "same_shape" and len(names) == 1):
        what = f"'{bad[0]}' is not one" if bad else "list at least two"
        ctx.problem(key, f"'{key}' must list Tensor arguments of the schema; {what}")
        return ()
    return tuple(names)


def _check_outputs_used(outputs: tuple[TritonOutput, ...], args: tuple[TritonArg, ...], ctx: _Ctx) -> None:
    passed = {a.value.name for a in args if isinstance(a.value, jx.Name)}
    for output in outputs:
        if args and output.name not in passed:
            ctx.problem("outputs", f"output '{output.name}' is never passed to the kernel (no key of 'args' names it)")
