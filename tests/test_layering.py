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
# the standard library). Entry points (api, dynamo_backend, pipeline) tie the rooms together and may
# import any of them; no room imports an entry point.
ROOM_IMPORTS: dict[str, set[str]] = {
    "opgen.errors": set(),
    "opgen.disk": set(),
    "opgen.jit": {"opgen.errors", "opgen.disk"},
    "opgen.runtime.errors": {"opgen.errors"},
    "opgen.runtime.report": set(),
    "opgen.runtime.ir": set(),
    "opgen.runtime.registry": {"opgen.runtime.ir"},
    "opgen.runtime.passes": {"opgen.runtime.ir", "opgen.runtime.registry"},
    "opgen.runtime.codegen": {"opgen.runtime.ir"},
    "opgen.runtime.torch_symbols": {"opgen.runtime.ir"},
    "opgen.runtime.lowering": {
        "opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.errors", "opgen.runtime.torch_symbols", "opgen.jit",
    },
    "opgen.runtime.capture": {"opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.errors"},
    "opgen.runtime.artifact": {"opgen.runtime.ir", "opgen.runtime.codegen", "opgen.disk"},
    "opgen.runtime.execution": {
        "opgen", "opgen.jit", "opgen.disk", "opgen.runtime.errors", "opgen.runtime.ir", "opgen.runtime.registry",
        "opgen.runtime.torch_symbols", "opgen.runtime.artifact",
    },
}  # fmt: skip
ENTRY_POINTS = {
    "opgen.runtime", "opgen.runtime.api", "opgen.runtime.dynamo_backend", "opgen.runtime.pipeline",
    "opgen.runtime.packaging",
}  # fmt: skip
TORCH_FREE = (
    *("opgen.runtime.ir", "opgen.runtime.registry", "opgen.runtime.report", "opgen.runtime.passes"),
    *("opgen.runtime.codegen", "opgen.runtime.artifact", "opgen.jit.errors", "opgen.errors", "opgen.disk"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def runtime_imports(path: Path) -> set[str]:
    """The opgen modules `path` imports when it runs (lazy imports too; `if TYPE_CHECKING:` ones not):
    `from opgen.runtime import executor` counts as importing the submodule, not the package."""
    name = module_name(path)
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.dump(block.test)
        for n in ast.walk(block)
    }  # fmt: skip
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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
    """Each backend is a sibling implementing the whole `Backend` interface, never a subclass of another."""
    from opgen.runtime.codegen.backend import Backend
    from opgen.runtime.codegen.python import PythonBackend

    for backend in (PythonBackend,):
        assert backend.__bases__ == (Backend,), backend
        assert not backend.__abstractmethods__, backend.__abstractmethods__


def test_modules_stay_small() -> None:
    for path in RUNTIME.rglob("*.py"):
        assert len(path.read_text().splitlines()) < 400, f"{path.name} has grown past 400 lines"


def test_package_exports_resolve_lazily() -> None:
    import opgen
    from opgen.runtime.errors import UnsupportedOpError

    assert opgen.UnsupportedOpError is UnsupportedOpError
    assert callable(opgen.compile)
