"""The interface every backend implements: a `Program` -> source text in one target language.

A backend is a sibling of the others, never a subclass of one: it prints each kind of IR line with
its own method, and the whole program (its prologue, setup, call and epilogue) with `emit`.
`line_text` is the one dispatch over line kinds, so a new kind of line is a new abstract method
that every backend must then implement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import assert_never

from opgen.runtime.codegen.manifest import Manifest
from opgen.runtime.ir import Alloc, Comment, Constant, Free, Guard, KernelCall, Line, Program, Return, SizeLet, View


@dataclass(frozen=True, slots=True)
class Source:
    """A printed program: its text and what it binds."""

    text: str
    manifest: Manifest


@dataclass(frozen=True, slots=True)
class Printed:
    """What one execution backend printed for a graph (`opgen.runtime.backends`): its program's text,
    or, where the backend cannot run the graph yet, why (then no text)."""

    text: str = ""
    error: str = ""


class Backend(ABC):
    """One target language. Each line method returns the line's statements, unindented."""

    @abstractmethod
    def kernel_call(self, line: KernelCall) -> list[str]: ...

    @abstractmethod
    def alloc(self, line: Alloc) -> list[str]: ...

    @abstractmethod
    def view(self, line: View) -> list[str]: ...

    @abstractmethod
    def free(self, line: Free) -> list[str]: ...

    @abstractmethod
    def constant(self, line: Constant) -> list[str]: ...

    @abstractmethod
    def size_let(self, line: SizeLet) -> list[str]: ...

    @abstractmethod
    def comment(self, line: Comment) -> list[str]: ...

    @abstractmethod
    def guard(self, line: Guard) -> list[str]: ...

    @abstractmethod
    def return_(self, line: Return) -> list[str]: ...

    @abstractmethod
    def emit(self, program: Program, header: str = "") -> Source:
        """The whole program's source."""

    def line_text(self, line: Line) -> list[str]:
        match line:
            case KernelCall():
                return self.kernel_call(line)
            case Alloc():
                return self.alloc(line)
            case View():
                return self.view(line)
            case Free():
                return self.free(line)
            case Constant():
                return self.constant(line)
            case SizeLet():
                return self.size_let(line)
            case Comment():
                return self.comment(line)
            case Guard():
                return self.guard(line)
            case Return():
                return self.return_(line)
            case _:
                assert_never(line)
