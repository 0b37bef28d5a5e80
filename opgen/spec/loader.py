"""Read an op spec YAML file into raw entries that remember their source lines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class SpecError(Exception):
    """A spec with problems. `problems` lists each as `path:line: op 'name': what is wrong`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{len(problems)} {noun} in the op spec:\n" + "\n".join(problems))


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One mapping of the top-level list: its fields, the line of each field, and its own line."""

    fields: dict[str, Any]
    lines: dict[str, int]
    line: int


class _LineLoader(yaml.SafeLoader):
    """A safe loader whose mappings also record the (1-based) line of each key."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = yaml.SafeLoader.construct_mapping(loader, node, deep=True)
    lines = {str(k.value): k.start_mark.line + 1 for k, _ in node.value}
    return _LinedDict(mapping, lines, node.start_mark.line + 1)


class _LinedDict(dict):  # type: ignore[type-arg]
    def __init__(self, mapping: dict[str, Any], lines: dict[str, int], line: int) -> None:
        super().__init__(mapping)
        self.lines = lines
        self.line = line


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _character(exc: yaml.reader.ReaderError) -> str:
    code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
    return f"character U+{code:04X}"


def _decode(data: bytes, name: str) -> str:
    """The file as text; bytes that are not UTF-8 are a SpecError naming their line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        byte = data[exc.start : exc.start + 1].hex()
        raise SpecError([f"{name}:{line}: the spec is not valid UTF-8 (byte 0x{byte})"]) from None


def load_entries(path: Path, display_name: str | None = None) -> tuple[str, list[RawEntry | tuple[int, Any]]]:
    """Parse `path`; return the name used in messages and the top-level items: a RawEntry for each
    mapping, a (line, value) pair for anything else.

    Raises SpecError for unreadable files, YAML syntax errors and a top level that is not a list.
    """
    name = display_name or path.name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError([f"{name}: cannot read the spec: {exc.strerror}"]) from None
    text = _decode(data, name)
    try:
        loader = _LineLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, most controls)
        line = text.count("\n", 0, exc.position) + 1
        raise SpecError([f"{name}:{line}: invalid YAML: {_character(exc)} is not allowed in YAML"]) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise SpecError([f"{name}:1: the spec is empty; expected a list of ops"])
        if not isinstance(root, yaml.SequenceNode):
            kind = "mapping" if isinstance(root, yaml.MappingNode) else "scalar"
            raise SpecError([f"{name}:{root.start_mark.line + 1}: the top level must be a list of ops, not a {kind}"])
        items = [(node.start_mark.line + 1, loader.construct_object(node, deep=True)) for node in root.value]
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise SpecError([f"{name}:{line}: invalid YAML: {exc.problem}"]) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise SpecError([f"{name}:{line}: invalid YAML: {_character(exc)} is not allowed in YAML"]) from None
    except RecursionError:
        raise SpecError([f"{name}:1: invalid YAML: nested too deeply"]) from None
    finally:
        loader.dispose()
    entries: list[RawEntry | tuple[int, Any]] = []
    for line, item in items:
        if isinstance(item, _LinedDict):
            entries.append(RawEntry(dict(item), item.lines, item.line))
        else:
            entries.append((line, item))
    return name, entries
