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


def load_entries(path: Path, display_name: str | None = None) -> tuple[str, list[RawEntry | tuple[int, Any]]]:
    """Parse `path`; return the name used in messages and the top-level items: a RawEntry for each
    mapping, a (line, value) pair for anything else.

    Raises SpecError for unreadable files, YAML syntax errors and a top level that is not a list.
    """
    name = display_name or path.name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([f"{name}: cannot read the spec: {exc.strerror}"]) from None
    loader = _LineLoader(text)
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
    finally:
        loader.dispose()
    entries: list[RawEntry | tuple[int, Any]] = []
    for line, item in items:
        if isinstance(item, _LinedDict):
            entries.append(RawEntry(dict(item), item.lines, item.line))
        else:
            entries.append((line, item))
    return name, entries
