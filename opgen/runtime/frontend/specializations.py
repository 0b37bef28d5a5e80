"""The compiled versions of one model, found by their inputs: the cache `opgen.compile`'s policy fills.

A static specialization is found by its inputs' signature (dtype, device, sizes, strides); a dynamic
one by its ranged input check, in the order they were compiled. Reads take no lock (a dict lookup and
a list scan, as a call's slow path needs); compiling does, through `lock`, which the policy holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opgen.runtime.execution.guards import Check, InputSpec, signature

Compiled = Callable[..., Any]


@dataclass
class Specializations:
    by_signature: dict[Any, Compiled] = field(default_factory=dict)
    ranged: list[tuple[Check, Compiled, tuple[InputSpec, ...]]] = field(default_factory=list)  # (check, fn, specs)
    extra_classes: int = 0  # ranged functions beyond the first of each compile (size classes)
    lock: Any = field(default_factory=threading.RLock, repr=False)  # guards adding and compiling

    def add_static(self, args: tuple[Any, ...], fn: Compiled) -> None:
        self.by_signature[signature(args)] = fn

    def add_ranged(self, check: Check, fn: Compiled, specs: tuple[InputSpec, ...]) -> None:
        self.ranged.append((check, fn, specs))

    def find(self, args: tuple[Any, ...]) -> Compiled | None:
        """The specialization compiled for these inputs, if any."""
        fn = self.by_signature.get(signature(args))
        return fn or next((f for check, f, _ in self.ranged if check(*args)), None)

    def find_ranged(self, args: tuple[Any, ...], besides: tuple[InputSpec, ...]) -> Compiled | None:
        """A dynamic specialization other than the one of `besides` whose check takes these inputs."""
        return next((fn for check, fn, own in self.ranged if own is not besides and check(*args)), None)

    def count(self) -> int:
        """How many compiles made them (a compile split into size classes counts once)."""
        return len(self.by_signature) + len(self.ranged) - self.extra_classes
