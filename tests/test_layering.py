"""Import rules: the generator never imports torch or the extension; the runtime never reads the spec."""

from __future__ import annotations

import ast
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
TORCH_FREE = [
    "ir.py",
    "ir_kernels.py",
    "python_backend.py",
    "registry.py",
    "report.py",
    *(f"passes/{p.name}" for p in (RUNTIME / "passes").glob("*.py")),
    *(f"fusion/{p.name}" for p in (RUNTIME / "fusion").glob("*.py")),
]


def test_ir_passes_and_backend_do_not_import_torch() -> None:
    """The IR, its passes and the Python backend are plain data and text: no torch, no graph."""
    for rel in TORCH_FREE:
        for name in imported_modules(RUNTIME / rel):
            assert name.split(".")[0] != "torch", f"{rel} imports {name}"
            assert not name.startswith(("opgen.runtime.lower", "opgen.runtime.export", "opgen.runtime.executor")), (
                f"{rel} imports {name}"
            )


def test_modules_stay_small() -> None:
    for path in RUNTIME.rglob("*.py"):
        assert len(path.read_text().splitlines()) < 400, f"{path.name} has grown past 400 lines"


def test_package_exports_resolve_lazily() -> None:
    import opgen
    from opgen.runtime.errors import UnsupportedOpError

    assert opgen.UnsupportedOpError is UnsupportedOpError
    assert callable(opgen.compile)
