"""What the C++ backend reads of `opgen.runtime.registry.KernelRegistry` (codegen imports only the IR):
each kernel_ops function's argument order and results, and for `recycle` lines its out= variant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class ArgInfo(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def kwarg_only(self) -> bool: ...


class OpInfo(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def args(self) -> Sequence[ArgInfo]: ...
    @property
    def returns(self) -> Sequence[str]: ...
    @property
    def returns_tuple(self) -> bool: ...
    @property
    def variant(self) -> str: ...
    @property
    def is_view(self) -> bool: ...


class KernelRegistry(Protocol):
    @property
    def by_name(self) -> Mapping[str, OpInfo]: ...
    def plain_out(self, name: str) -> OpInfo | None: ...
