"""What capture hands lowering besides the graph: each placeholder's role and each output's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlaceholderSpec:
    name: str  # the placeholder node's name
    kind: str  # "input" (a positional argument) | "constant" (bound from the constants mapping)
    key: str | None = None  # constants: the key in the constants mapping


@dataclass(frozen=True, slots=True)
class OutputSpec:
    kind: str  # "user" | "mutation" (the value is copied into `target` after the graph ran)
    target: str | None = None  # mutations: the placeholder written


@dataclass(frozen=True, slots=True)
class GraphSignature:
    placeholders: tuple[PlaceholderSpec, ...]
    outputs: tuple[OutputSpec, ...]
    form: str = "tuple"  # how user outputs are returned: "single" | "tuple" | "list" | "pytree"
