"""Import rules: the generator never imports torch or the extension; the runtime never reads the spec."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "opgen"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_generator_needs_only_yaml_and_jinja() -> None:
    files = [ROOT / "__main__.py", *(ROOT / "spec").glob("*.py"), *(ROOT / "gen").glob("*.py")]
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top not in ("torch", "numpy"), f"{path.name} imports {name}"
            assert not name.startswith(("opgen._C", "opgen.runtime", "opgen.bench")), f"{path.name} imports {name}"


def test_generator_reads_the_jit_expression_language_without_torch_or_triton() -> None:
    """The spec validator parses Triton-op expressions with opgen.jit.expr inside the build: importing
    it (and the opgen.jit package around it) must not pull in torch, triton or the extension."""
    for path in (ROOT / "jit" / "__init__.py", ROOT / "jit" / "expr.py"):
        for name in imported_modules(path):
            assert name.split(".")[0] not in ("torch", "triton", "numpy"), f"{path.name} imports {name}"
            assert not name.startswith(("opgen._C", "opgen.runtime", "opgen.jit.library")), (
                f"{path.name} imports {name}"
            )
    generator = [*(ROOT / "spec").glob("*.py"), *(ROOT / "gen").glob("*.py")]
    jit_imports = {n for path in generator for n in imported_modules(path) if n.startswith("opgen.jit")}
    assert jit_imports <= {"opgen.jit", "opgen.jit.expr"}, jit_imports  # the expression language, nothing else


def test_package_init_does_not_import_torch_eagerly() -> None:
    tree = ast.parse((ROOT / "__init__.py").read_text())
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert all("torch" not in ast.dump(n) for n in top_level)


def test_runtime_reads_ops_only_through_the_registry() -> None:
    for path in (ROOT / "runtime").rglob("*.py"):
        for name in imported_modules(path):
            assert not name.startswith(("opgen.spec", "opgen.gen", "yaml")), f"{path.name} imports {name}"


RUNTIME = ROOT / "runtime"
# The rooms of the runtime, in data-flow order, and the rooms each may import (besides itself, torch and
# the standard library). `pipeline` takes one graph through the rooms; the `frontend` (opgen.compile,
# the torch.compile backend, packages) sits on top and nothing imports it but the package itself.
ROOM_IMPORTS: dict[str, set[str]] = {
    "opgen.errors": set(),
    "opgen.disk": set(),
    "opgen.extensions": set(),  # the imported user extensions (standard library only)
    "opgen.jit": {"opgen.errors", "opgen.disk"},
    "opgen.runtime.errors": {"opgen.errors"},
    "opgen.runtime.report": set(),
    "opgen.runtime.ir": set(),
    "opgen.runtime.registry": {"opgen.runtime.ir"},
    "opgen.runtime.extension_registry": {"opgen.runtime.registry", "opgen.runtime.errors"},
    "opgen.runtime.passes": {"opgen.runtime.ir", "opgen.runtime.registry"},
    "opgen.runtime.codegen": {"opgen.runtime.ir"},
    "opgen.runtime.torch_symbols": {"opgen.runtime.ir"},
    "opgen.runtime.lowering": {
        "opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.errors", "opgen.runtime.torch_symbols",
        "opgen.jit",
    },
    "opgen.runtime.capture": {"opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.errors"},
    "opgen.runtime.artifact": {"opgen.runtime.ir", "opgen.runtime.codegen", "opgen.disk"},
    "opgen.runtime.execution": {
        "opgen", "opgen.jit", "opgen.disk", "opgen.runtime.errors", "opgen.runtime.ir", "opgen.runtime.registry",
        "opgen.runtime.torch_symbols", "opgen.runtime.artifact",
    },
    "opgen.runtime.backends": {
        "opgen", "opgen.runtime.errors", "opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.codegen",
        "opgen.runtime.artifact", "opgen.runtime.execution",
    },
    "opgen.runtime.pipeline": {
        "opgen", "opgen.jit", "opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.passes",
        "opgen.runtime.codegen", "opgen.runtime.lowering", "opgen.runtime.capture", "opgen.runtime.artifact",
        "opgen.runtime.execution", "opgen.runtime.backends", "opgen.extensions", "opgen.runtime.extension_registry",
    },
    "opgen.runtime.frontend": {
        "opgen", "opgen.extensions", "opgen.runtime.errors", "opgen.runtime.report", "opgen.runtime.ir",
        "opgen.runtime.registry",
        "opgen.runtime.torch_symbols", "opgen.runtime.lowering", "opgen.runtime.capture", "opgen.runtime.artifact",
        "opgen.runtime.execution", "opgen.runtime.backends", "opgen.runtime.pipeline",
    },
}  # fmt: skip
ENTRY_POINTS = {"opgen.runtime"}  # the package: re-exports the frontend's entry points
TORCH_FREE = (
    *("opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.report", "opgen.runtime.passes"),
    *("opgen.extensions", "opgen.runtime.extension_registry"),
    *("opgen.runtime.codegen", "opgen.runtime.artifact", "opgen.jit.errors", "opgen.errors", "opgen.disk"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def runtime_imports(path: Path) -> set[str]:
    """The opgen modules `path` imports (lazy imports and `if TYPE_CHECKING:` ones too: a module that names
    another's types depends on it): `from opgen.runtime import executor` counts as importing the submodule,
    not the package."""
    name = module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{package}.{base}" if base else package
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
    return {m for m in found if m in MODULES and m != name}


def room(module: str) -> str:
    """The longest key of ROOM_IMPORTS (or entry point) that `module` lies in."""
    for length in range(module.count(".") + 1, 0, -1):
        prefix = ".".join(module.split(".")[:length])
        if prefix in ROOM_IMPORTS or prefix in ENTRY_POINTS:
            return prefix
    return module


def test_every_runtime_module_lies_in_a_room() -> None:
    for name in MODULES:
        if name.startswith(("opgen.runtime", "opgen.jit")):
            assert room(name) in ROOM_IMPORTS or name in ENTRY_POINTS, f"{name} is in no room of ROOM_IMPORTS"


def test_rooms_import_only_the_rooms_below_them() -> None:
    for name, path in MODULES.items():
        here = room(name)
        if here not in ROOM_IMPORTS:
            continue
        for imported in runtime_imports(path):
            there = room(imported)
            assert there == here or there in ROOM_IMPORTS[here], f"{name} ({here}) imports {imported} ({there})"


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import cycle in opgen, however long (Tarjan's strongly connected components)."""
    graph = {name: runtime_imports(path) for name, path in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert not cycles, f"import cycles: {cycles}"


def test_jit_does_not_load_the_runtime_or_torch_for_its_errors() -> None:
    code = "import sys, opgen.jit.errors; print(sorted(m for m in sys.modules if m.startswith(('opgen', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["opgen", "opgen.errors", "opgen.jit", "opgen.jit.errors"])


def test_ir_passes_and_backends_do_not_import_torch() -> None:
    """The IR, its passes, the backends and the artifact are plain data and text: no torch, no graph."""
    for name, path in MODULES.items():
        if room(name) in TORCH_FREE or name in TORCH_FREE:
            for imported in imported_modules(path):
                assert imported.split(".")[0] != "torch", f"{name} imports {imported}"


def test_backends_implement_every_line_kind() -> None:
    """Each printer is a sibling implementing the whole `Backend` interface, never a subclass of another;
    each registered execution backend prints through one of them."""
    import importlib

    from opgen.runtime.backends import TARGETS
    from opgen.runtime.codegen.backend import Backend

    for name in MODULES:
        if name.startswith("opgen.runtime.codegen."):
            importlib.import_module(name)
    printers = Backend.__subclasses__()
    assert {p.__name__ for p in printers} >= {"PythonBackend", "CppBackend"}, printers
    for printer in printers:
        assert printer.__bases__ == (Backend,), printer
        assert not printer.__abstractmethods__, (printer, printer.__abstractmethods__)
        assert not printer.__subclasses__(), f"{printer.__name__} is subclassed: a backend is a sibling"
    for name, target in TARGETS.items():
        assert target.name == name and callable(target.print) and callable(target.bind), target


def test_modules_stay_small() -> None:
    for path in RUNTIME.rglob("*.py"):
        assert len(path.read_text().splitlines()) < 400, f"{path.name} has grown past 400 lines"


def test_package_exports_resolve_lazily() -> None:
    import opgen
    from opgen.runtime.errors import UnsupportedOpError

    assert opgen.UnsupportedOpError is UnsupportedOpError
    assert callable(opgen.compile)


# -- csrc/opgen: the C++ mirrors the rooms, with the same kind of rules on its includes ---------------------------

CSRC = ROOT.parent / "csrc"
# The rooms of csrc/opgen, bottom up, and the rooms each may include (besides itself, torch and the standard
# library); docs/development.md says what each holds. kernels, exec and package are the runtime a C++ program
# links with no Python (opgen_add_runtime); module ties the Python-facing rooms into the `_C` extension.
CPP_ROOM_INCLUDES: dict[str, set[str]] = {
    "kernels": set(),
    "exec": {"kernels"},
    "package": {"exec", "kernels"},
    "py": set(),
    "bind": {"py", "kernels"},
    "jit": {"bind", "py", "kernels"},
    "graphs": {"py"},
    "module": {"exec", "package", "py", "jit", "graphs"},
}
PYTHON_FREE_ROOMS = ("kernels", "exec", "package")
# What only builds against an interpreter: CPython's headers, pybind11, torch's Python bindings.
PYTHON_HEADER_PREFIXES = (
    "Python.h", "structmember.h", "pybind11/", "torch/csrc/autograd/python_", "torch/csrc/utils/python",
    "torch/csrc/utils/pybind", "torch/csrc/utils/tensor_", "torch/csrc/Device.h", "torch/csrc/Dtype.h",
    "torch/csrc/Layout.h", "torch/csrc/MemoryFormat.h", "torch/csrc/Exceptions.h", "torch/csrc/DynamicTypes.h",
)  # fmt: skip


def cpp_sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.is_file())


def cpp_includes(text: str) -> list[str]:
    """The headers a C++ file's `#include <...>` and `#include "..."` lines name, in order."""
    names = []
    for line in text.splitlines():
        directive = line.strip()
        if not directive.startswith("#") or not directive[1:].lstrip().startswith("include"):
            continue
        target = directive[1:].lstrip().removeprefix("include").strip()
        if target[:1] in ('"', "<"):
            names.append(target[1:].split('"' if target[0] == '"' else ">")[0])
    return names


def cpp_room(header: str) -> str:
    """`opgen/exec/executor.h` -> `exec`."""
    return header.split("/")[1]


def test_every_csrc_file_lies_in_a_room() -> None:
    for path in cpp_sources():
        parts = path.relative_to(CSRC).parts
        assert len(parts) == 3 and parts[0] == "opgen", f"{path}: not in a room (csrc/opgen/<room>/<file>)"
        assert parts[1] in CPP_ROOM_INCLUDES, f"{path}: {parts[1]} is no room of CPP_ROOM_INCLUDES"


def test_csrc_includes_resolve_and_keep_to_the_room_rules() -> None:
    for path in cpp_sources():
        here = path.relative_to(CSRC).parts[1]
        for name in cpp_includes(path.read_text()):
            if not name.startswith("opgen/"):
                continue
            assert (CSRC / name).is_file(), f"{path.name} includes {name}, which csrc does not have"
            there = cpp_room(name)
            assert there == here or there in CPP_ROOM_INCLUDES[here], f"{path.name} ({here}) includes {name}"


def test_the_runtime_rooms_reach_no_python_header() -> None:
    """kernels, exec and package build without Python (a C++ program runs packages with libtorch only): no file of
    theirs includes a Python header or a header of py/, however deep through opgen's own headers."""
    for path in cpp_sources():
        room_of_path = path.relative_to(CSRC).parts[1]
        if room_of_path not in PYTHON_FREE_ROOMS:
            continue
        seen: set[str] = set()
        todo = [(name, path.name) for name in cpp_includes(path.read_text())]
        while todo:
            name, via = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            assert not name.startswith(PYTHON_HEADER_PREFIXES), f"{path.name} reaches {name} (via {via})"
            if name.startswith("opgen/"):
                assert cpp_room(name) != "py", f"{path.name} reaches {name} (via {via})"
                todo += [(n, name) for n in cpp_includes((CSRC / name).read_text())]


def test_every_csrc_source_is_compiled() -> None:
    """opgen.cmake names every .cpp of csrc (by room): a file moved or added is built, not left out."""
    cmake = (ROOT / "cmake" / "opgen.cmake").read_text()
    for path in cpp_sources():
        if path.suffix == ".cpp":
            assert path.relative_to(CSRC / "opgen").as_posix() in cmake, f"opgen.cmake does not build {path.name}"


def test_generated_code_includes_existing_helpers() -> None:
    """What the generator writes (its templates and emitters, and the generated/ snapshot) includes opgen's headers
    where they are."""
    texts = [p.read_text() for p in (*(ROOT / "templates").glob("*.j2"), *(ROOT.parent / "generated").glob("*"))]
    from opgen.spec.model import OWN_HEADER  # the header of opgen's own kernels, which spec entries name

    names = {OWN_HEADER} | {name for text in texts for name in cpp_includes(text) if name.startswith("opgen/")}
    for name in sorted(names):
        assert (CSRC / name).is_file(), f"generated code includes {name}, which csrc does not have"
