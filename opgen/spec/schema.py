"""A parser for the ATen schema language used by `native_functions.yaml`.

    add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
    max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)

`parse_schema` returns a `Schema` or raises `SchemaSyntaxError` with a message that says what is
wrong; callers add the source location.
"""

from __future__ import annotations

import keyword
import re

from opgen.spec.model import BASE_TYPES, Alias, Arg, Return, Schema, Type


class SchemaSyntaxError(ValueError):
    pass


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: `$` would accept a trailing newline
_TYPE = re.compile(
    r"^(?P<base>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:\((?P<alias>[a-z][a-z0-9]*)(?P<write>!)?(?P<wild>\s*->\s*\*)?\))?"
    r"(?P<elem_opt>\?)?"
    r"(?:\[(?P<size>\d*)\])?"
    r"(?P<opt>\?)?$"
)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets and quotes: `int[2] a=[0, 0], int b` -> two parts."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                raise SchemaSyntaxError(f"unbalanced '{ch}' in '{text}'")
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth != 0 or quote:
        raise SchemaSyntaxError(f"unbalanced brackets or quotes in '{text}'")
    parts.append(text[start:].strip())
    return parts


def parse_type(text: str) -> tuple[Type, Alias | None]:
    match = _TYPE.match(text.strip())
    if match is None:
        raise SchemaSyntaxError(f"cannot read type '{text}'")
    base = match["base"]
    if base not in BASE_TYPES:
        raise SchemaSyntaxError(f"unknown type '{base}' (known: {', '.join(BASE_TYPES)})")
    is_list = match["size"] is not None
    if match["elem_opt"] and not is_list:
        optional, elem_optional = True, False
    else:
        optional, elem_optional = bool(match["opt"]), bool(match["elem_opt"])
    if elem_optional and match["opt"]:
        raise SchemaSyntaxError(f"type '{text}': an optional list of optionals is not supported")
    size = int(match["size"]) if is_list and match["size"] else None
    alias = Alias(match["alias"], bool(match["write"]), bool(match["wild"])) if match["alias"] else None
    if alias is not None and base != "Tensor":
        raise SchemaSyntaxError(f"type '{text}': only Tensor types take an alias annotation")
    return Type(base, optional, is_list, size, elem_optional), alias


def _parse_arg(text: str, kwarg_only: bool) -> Arg:
    decl, eq, default = text.partition("=")
    pieces = decl.strip().rsplit(None, 1)
    if len(pieces) != 2:
        raise SchemaSyntaxError(f"argument '{text}' is not of the form 'Type name[=default]'")
    name = pieces[1]
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise SchemaSyntaxError(f"'{name}' is not a valid argument name")
    try:
        type_, alias = parse_type(pieces[0])
    except SchemaSyntaxError as exc:
        raise SchemaSyntaxError(f"arg '{name}': {exc}") from None
    if eq and not default.strip():
        raise SchemaSyntaxError(f"argument '{name}' has '=' but no default")
    return Arg(name, type_, kwarg_only, alias, default.strip() if eq else None)


def _split_return(part: str) -> list[str]:
    close = part.rindex(")")
    rest = part[close + 1 :].split()
    return [part[: close + 1] + (rest[0] if rest and rest[0].startswith("[") else "")] + [
        r for r in rest if not r.startswith("[")
    ]


def _parse_returns(text: str) -> tuple[tuple[Return, ...], bool]:
    text = text.strip()
    is_tuple = text.startswith("(") and text.endswith(")")
    body = text[1:-1].strip() if is_tuple else text
    if not body:
        return (), is_tuple
    returns = []
    for part in split_top_level(body):
        pieces = part.rsplit(None, 1) if part.count(")") == 0 else _split_return(part)
        if len(pieces) not in (1, 2):
            raise SchemaSyntaxError(f"return '{part}' is not of the form 'Type [name]'")
        type_, alias = parse_type(pieces[0])
        returns.append(Return(type_, pieces[1] if len(pieces) == 2 else None, alias))
    return tuple(returns), is_tuple


def _top_level_arrow(text: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith("->", i):
            return i
    return -1


def parse_schema(text: str) -> Schema:
    arrow = _top_level_arrow(text)
    if arrow < 0:
        raise SchemaSyntaxError("schema has no '->' before its returns")
    head, returns_text = text[:arrow].strip(), text[arrow + 2 :]
    open_paren = head.find("(")
    if open_paren < 0 or not head.endswith(")"):
        raise SchemaSyntaxError("schema must look like 'name.overload(args) -> returns'")
    name, _, overload = head[:open_paren].strip().partition(".")
    if not _NAME.match(name):
        raise SchemaSyntaxError(f"'{name}' is not a valid op name")
    if overload and not _NAME.match(overload):
        raise SchemaSyntaxError(f"'{overload}' is not a valid overload name")
    args: list[Arg] = []
    kwarg_only = False
    body = head[open_paren + 1 : -1].strip()
    for part in split_top_level(body) if body else []:
        if part == "*":
            if kwarg_only:
                raise SchemaSyntaxError("'*' appears twice")
            kwarg_only = True
            continue
        args.append(_parse_arg(part, kwarg_only))
    returns, is_tuple = _parse_returns(returns_text)
    return Schema(name, overload, tuple(args), returns, is_tuple)
