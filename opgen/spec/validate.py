"""Turn raw spec entries into validated, frozen `OpSpec` records, reporting every problem at once.

Each entry binds one functional op and, on request, its in-place and out variants:

    - func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
      kernels: {cpu: at::cpu::add, cuda: at::cuda::add}
      inplace: add_.Tensor
      out: add.out
      doc: Adds other, scaled by alpha, to self.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from pathlib import Path
from typing import Any

from opgen.spec import user_kernels
from opgen.spec.checks import check_problems
from opgen.spec.defaults import parse_default
from opgen.spec.kernels import KernelIndex
from opgen.spec.loader import RawEntry, SpecError, load_entries
from opgen.spec.model import (
    OWN_NAMESPACE,
    Alias,
    Arg,
    Kernel,
    Location,
    OpSpec,
    Return,
    Schema,
    TritonKernel,
    Type,
    Variant,
)
from opgen.spec.problems import Problems, unknown_key
from opgen.spec.schema import SchemaSyntaxError, parse_schema
from opgen.spec.triton import triton_kernel

ENTRY_KEYS = (
    *("func", "python", "kernels", "triton", "inplace", "out", "release_gil", "checks", "opaque"),
    *("includes", "torch_op", "doc"),
)
# Keys a Triton op cannot have: its variants are entries of their own, and its launch keeps the GIL.
NOT_WITH_TRITON = ("kernels", "inplace", "out", "release_gil")
VARIANT_KEYS = ("func", "python", "kernels", "checks")
LIST_BASES = ("Tensor", "int", "SymInt", "float", "bool")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # C0 controls but tab and newline, and DEL


def load_spec(
    path: Path | str, display_name: str | None = None, kernels: KernelIndex | None = None
) -> tuple[OpSpec, ...]:
    """Load and validate a spec file. Raises SpecError listing every problem.

    Kernels are checked against `kernels` (default: the dispatch headers of the installed torch,
    when there is one), so that a kernel torch lacks is a spec error, not a C++ compiler error.
    """
    name, entries = load_entries(Path(path), display_name)
    problems = Problems(name)
    ops: list[OpSpec] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, RawEntry):
            problems.add(
                entry[0], None, f"item {index + 1} of the list must be a mapping with a 'func' key, not {entry[1]!r}"
            )
            continue
        ops.extend(_entry_ops(entry, problems))
    if not entries:
        problems.add(1, None, "the spec lists no ops")
    _check_unique(ops, problems)
    user_kernels.check_registry_names(ops, problems)
    if not problems.items:
        _check_kernels(ops, kernels or KernelIndex.find(), problems)
    if problems.items:
        raise SpecError(problems.items)
    return tuple(ops)


def _entry_ops(entry: RawEntry, problems: Problems) -> list[OpSpec]:
    fields, lines = entry.fields, entry.lines
    func = fields.get("func")
    if not isinstance(func, str):
        problems.add(entry.line, None, "entry needs a 'func' key holding the op's schema string")
        return []
    op_name = func.split("(", 1)[0].strip() or func
    for key in fields:
        if key not in ENTRY_KEYS:
            problems.add(lines.get(str(key), entry.line), op_name, unknown_key(key, ENTRY_KEYS))
    count = len(problems.items)
    schema = _schema(func, lines["func"], op_name, problems)
    if "triton" in fields:
        kernels: tuple[Kernel, ...] | None = ()
        triton = _triton(entry, schema, op_name, problems)
    else:
        kernels = user_kernels.parse_kernels(fields.get("kernels"), lines.get("kernels", entry.line), op_name, problems)
        triton = None
    doc = fields.get("doc", "")
    if not isinstance(doc, str):
        problems.add(lines["doc"], op_name, "'doc' must be a string")
    elif control := _CONTROL.search(doc):
        code = f"U+{ord(control.group()):04X}"
        problems.add(lines["doc"], op_name, f"'doc' holds the control character {code}; write printable text")
    release_gil = fields.get("release_gil", False)
    if not isinstance(release_gil, bool):
        problems.add(lines["release_gil"], op_name, f"'release_gil' must be true or false, not {release_gil!r}")
    python = fields.get("python")
    checks: tuple[str, ...] = ()
    if schema is not None and "checks" in fields:
        checks, messages = check_problems(fields["checks"], schema)
        for message in messages:
            problems.add(lines["checks"], op_name, message)
    opaque = _opaque(fields, lines, schema, kernels, op_name, problems)
    includes = user_kernels.includes(fields, lines, kernels, op_name, problems)
    torch_op = user_kernels.torch_op(fields, lines, kernels, op_name, problems)
    if schema is None or kernels is None or len(problems.items) > count:
        return []
    python_name = python if python is not None else default_python_name(schema)
    if not _python_name_ok(python_name, lines.get("python", entry.line), op_name, problems):
        return []
    location = Location(problems.path, lines["func"])
    own = variant_of(schema)
    base = OpSpec(
        schema, python_name, kernels, own, python_name, str(doc), release_gil, location, triton, checks, opaque
    )
    base = dataclasses.replace(base, includes=includes, torch_op=torch_op)
    ops = [base]
    for kind in (Variant.INPLACE, Variant.OUT):
        if kind.value in fields:
            line = lines[kind.value]
            variant = _variant(base, kind, fields[kind.value], Location(problems.path, line), problems)
            if variant is not None:
                ops.append(variant)
    return ops


def _triton(entry: RawEntry, schema: Schema | None, op: str, problems: Problems) -> TritonKernel | None:
    """The `triton:` section; the keys a Triton op cannot have are problems of their own."""
    for key in NOT_WITH_TRITON:
        if key in entry.fields:
            why = {
                "kernels": "give either 'kernels' (ATen kernels) or 'triton', not both",
                "release_gil": "a Triton op keeps the GIL while it launches: remove 'release_gil'",
            }.get(
                key, f"a Triton op has no '{key}' variant; declare it as an entry of its own with a Tensor(a!) schema"
            )
            problems.add(entry.lines[key], op, why)
    if schema is None:
        return None
    line = entry.lines["triton"]
    return triton_kernel(entry.fields["triton"], line, schema, lambda ln, msg: problems.add(ln, op, msg))


def default_python_name(schema: Schema) -> str:
    """`add.Tensor` -> `add`; `sum.dim_IntList` -> `sum_dim_intlist`."""
    if schema.overload in ("", "default", "Tensor"):
        return schema.name
    return f"{schema.name}_{schema.overload.lower()}"


def variant_of(schema: Schema) -> Variant:
    writes = [a for a in schema.args if a.alias is not None and a.alias.is_write]
    if any(a.kwarg_only for a in writes):
        return Variant.OUT
    if writes and writes[0] is schema.args[0]:
        return Variant.INPLACE
    return Variant.FUNCTIONAL


def _schema(text: str, line: int, op: str, problems: Problems) -> Schema | None:
    if control := _CONTROL.search(text.replace("\t", " ").replace("\n", " ")):  # YAML may fold a long line
        problems.add(line, op, f"the schema holds the control character U+{ord(control.group()):04X}")
        return None
    try:
        schema = parse_schema(text)
    except SchemaSyntaxError as exc:
        problems.add(line, op, str(exc))
        return None
    before = len(problems.items)
    _check_args(schema, line, problems)
    _check_returns(schema, line, problems)
    return schema if len(problems.items) == before else None


def _check_args(schema: Schema, line: int, problems: Problems) -> None:
    op, seen, after_default = schema.qualified_name, set(), None
    for arg in schema.args:
        if arg.name in seen:
            problems.add(line, op, f"arg '{arg.name}' appears twice")
        seen.add(arg.name)
        if arg.alias is not None and arg.alias.is_write and (arg.type.optional or arg.type.is_list):
            problems.add(line, op, f"arg '{arg.name}': only a plain Tensor can be written ('{arg.type}')")
        if arg.type.is_list and arg.type.base not in LIST_BASES:
            problems.add(
                line,
                op,
                f"arg '{arg.name}': lists of '{arg.type.base}' are not supported (allowed: {', '.join(LIST_BASES)})",
            )
        if arg.type.is_list and arg.type.base == "bool" and (not arg.type.size or arg.type.optional):
            problems.add(
                line,
                op,
                f"arg '{arg.name}': a list of bools needs a fixed size and no '?' ('bool[3]', not '{arg.type}')",
            )
        if arg.default is not None:
            try:
                parse_default(arg.type, arg.default)
            except ValueError as exc:
                problems.add(line, op, f"arg '{arg.name}': {exc}")
            if not arg.kwarg_only:
                after_default = arg.name
        elif after_default is not None and not arg.kwarg_only:
            problems.add(line, op, f"arg '{arg.name}' has no default but follows '{after_default}', which has one")


def _check_returns(schema: Schema, line: int, problems: Problems) -> None:
    op = schema.qualified_name
    arg_sets = {a.alias.alias_set: a for a in schema.args if a.alias is not None}
    if not schema.returns:
        problems.add(line, op, "an op must return at least one Tensor")
    has_tensor = any(r.type.base == "Tensor" for r in schema.returns)
    for ret in schema.returns:
        if _is_int_return(ret) and len(schema.returns) > 1 and has_tensor:
            continue  # an int beside tensors (fused attention's max_q): returned as a Python int
        if ret.type.base != "Tensor" or ret.type.optional or ret.type.elem_optional:
            allowed = "Tensor, Tensor[]" + ("; int and SymInt beside a Tensor" if len(schema.returns) > 1 else "")
            problems.add(line, op, f"return type '{ret.type}' is not supported (allowed: {allowed})")
        if ret.type.is_list and len(schema.returns) > 1:
            problems.add(line, op, "a Tensor[] return must be the only return")
        if ret.alias is None:
            continue
        source = arg_sets.get(ret.alias.alias_set)
        if source is None:
            problems.add(line, op, f"return alias '{ret.alias}' refers to no argument")
        elif ret.alias.is_write != source.alias.is_write:  # type: ignore[union-attr]
            problems.add(line, op, f"return alias '{ret.alias}' and arg '{source.name}' disagree on '!'")


def _is_int_return(ret: Return) -> bool:
    return ret.type.base in ("int", "SymInt") and not ret.type.optional and not ret.type.is_list and ret.alias is None


def _opaque(
    fields: dict[str, Any],
    lines: dict[str, int],
    schema: Schema | None,
    kernels: tuple[Kernel, ...] | None,
    op: str,
    problems: Problems,
) -> tuple[str, ...]:
    """`opaque:`: Tensor arguments that may also be opaque oneDNN (mkldnn-layout) tensors; own kernels only."""
    if "opaque" not in fields or schema is None:
        return ()
    value, line = fields["opaque"], lines["opaque"]
    tensors = [a.name for a in schema.args if a.type.base == "Tensor" and not a.type.is_list]
    if not isinstance(value, list) or not all(isinstance(v, str) and v in tensors for v in value):
        problems.add(
            line, op, f"'opaque' must be a list of Tensor argument names ({', '.join(tensors)}), not {value!r}"
        )
        return ()
    if kernels is not None and not all(k.own for k in kernels):
        problems.add(line, op, f"'opaque' needs {OWN_NAMESPACE} kernels: ATen's kernels take strided tensors only")
    return tuple(value)


def _python_name_ok(name: Any, line: int, op: str, problems: Problems) -> bool:
    if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
        problems.add(line, op, f"python name {name!r} is not a valid Python identifier")
        return False
    if name.startswith("get_kernel_op"):
        problems.add(line, op, f"python name '{name}' is reserved for the registry functions")
        return False
    return True


def _variant(base: OpSpec, kind: Variant, raw: Any, loc: Location, problems: Problems) -> OpSpec | None:
    op = base.schema.qualified_name
    if isinstance(raw, str):
        raw = {"func": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("func"), str):
        problems.add(
            loc.line,
            op,
            f"'{kind.value}' must be a schema name like 'add.out', a full schema, or a mapping with 'func'",
        )
        return None
    for key in raw:
        if key not in VARIANT_KEYS:
            problems.add(loc.line, op, f"'{kind.value}': " + unknown_key(key, VARIANT_KEYS))
            return None
    func: str = raw["func"]
    schema = (
        _schema(func, loc.line, op, problems) if "(" in func else _derive(base.schema, kind, func, loc.line, problems)
    )
    if schema is None:
        return None
    if variant_of(schema) is not kind:
        problems.add(loc.line, op, f"'{kind.value}' schema '{schema.qualified_name}' is not an {kind.value} schema")
        return None
    if "kernels" in raw:
        kernels = user_kernels.parse_kernels(raw["kernels"], loc.line, op, problems)
    else:
        suffix = "_" if kind is Variant.INPLACE else "_outf"
        kernels = tuple(dataclasses.replace(k, function=k.function + suffix) for k in base.kernels)
    python_name = raw.get("python", base.python_name + ("_" if kind is Variant.INPLACE else "_out"))
    if kernels is None or not _python_name_ok(python_name, loc.line, op, problems):
        return None
    own, messages = check_problems(raw["checks"], schema) if "checks" in raw else ((), [])
    checks = base.checks + tuple(c for c in own if c not in base.checks)  # the entry's, then the variant's own
    messages += check_problems(list(base.checks), schema)[1]
    if any(k.user for k in kernels) and not base.includes:
        messages.append("user kernels need 'includes' on the entry, naming the headers that declare them")
    for message in messages:
        problems.add(loc.line, op, f"'{kind.value}': {message}")
    return OpSpec(
        *(schema, python_name, kernels, kind, base.python_name, base.doc, base.release_gil, loc),
        checks=checks,
        includes=base.includes,
    )


def _derive(base: Schema, kind: Variant, name: str, line: int, problems: Problems) -> Schema | None:
    """Derive `add_.Tensor` or `add.out` from the functional schema."""
    op = base.qualified_name
    schema_name, _, overload = name.partition(".")
    if overload and not _IDENT.match(overload):
        problems.add(line, op, f"'{kind.value}' names {name!r}, whose overload {overload!r} is not a valid name")
        return None
    tensor_return = len(base.returns) == 1 and str(base.returns[0].type) == "Tensor"
    if not tensor_return:
        problems.add(
            line,
            op,
            f"'{kind.value}: {name}' can only be derived for an op returning one Tensor; write its schema in full",
        )
        return None
    written = Alias("a", True)
    if kind is Variant.INPLACE:
        first = base.args[0] if base.args else None
        if first is None or str(first.type) != "Tensor" or first.name != "self":
            problems.add(line, op, "an inplace variant needs 'Tensor self' as the first argument")
            return None
        if schema_name != base.name + "_":
            problems.add(line, op, f"inplace variant '{name}' must be named '{base.name}_.<overload>'")
            return None
        args = (dataclasses.replace(first, alias=written), *base.args[1:])
    else:
        if schema_name != base.name:
            problems.add(line, op, f"out variant '{name}' must be named '{base.name}.<overload>'")
            return None
        args = (*base.args, Arg("out", Type("Tensor"), kwarg_only=True, alias=written))
    return Schema(schema_name, overload, args, (Return(Type("Tensor"), None, written),))


def _check_unique(ops: list[OpSpec], problems: Problems) -> None:
    by_python: dict[str, OpSpec] = {}
    by_schema: dict[str, OpSpec] = {}
    for spec in ops:
        op = spec.schema.qualified_name
        first = by_schema.setdefault(op, spec)
        if first is not spec:
            problems.add(spec.location.line, op, f"schema '{op}' is already declared on line {first.location.line}")
            continue
        first = by_python.setdefault(spec.python_name, spec)
        if first is not spec:
            problems.add(
                spec.location.line,
                op,
                f"python name '{spec.python_name}' is already used by '{first.schema.qualified_name}' "
                f"(line {first.location.line}); set 'python:' to another name",
            )


def _check_kernels(ops: list[OpSpec], index: KernelIndex | None, problems: Problems) -> None:
    """Each kernel is declared by torch with the schema's number of arguments (the binding passes all)."""
    if index is None:
        return
    for op in ops:
        for kernel in (k for k in op.kernels if not k.user):  # user kernels: checked by the compiler
            problem = index.problem(kernel, len(op.schema.args))
            if problem:
                problems.add(op.location.line, op.schema.qualified_name, problem)
