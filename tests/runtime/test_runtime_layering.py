"""The IR, its passes and the Python backend are plain data and text: no torch, no graph."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "opgen" / "runtime"
TORCH_FREE = [
    "ir.py",
    "python_backend.py",
    "registry.py",
    "report.py",
    *(f"passes/{p.name}" for p in (RUNTIME / "passes").glob("*.py")),
]


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_ir_passes_and_backend_do_not_import_torch() -> None:
    for rel in TORCH_FREE:
        for name in imports(RUNTIME / rel):
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
