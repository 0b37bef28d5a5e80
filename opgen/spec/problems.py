"""Collecting spec problems as `path:line: op 'name': message` lines, shared by the validators."""

from __future__ import annotations

import difflib


class Problems:
    """Collects `path:line: op 'name': message` lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.items: list[str] = []

    def add(self, line: int, op: str | None, message: str) -> None:
        where = f"{self.path}:{line}: "
        self.items.append(where + (f"op '{op}': " if op else "") + message)


def unknown_key(key: object, allowed: tuple[str, ...]) -> str:
    """`unknown key 'kernel' (allowed: ...); did you mean 'kernels'?`"""
    close = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{key}' (allowed: {', '.join(allowed)}){hint}"
