"""The build's generator step (`opgen/cmake/generate.py`) runs the opgen the build names, even where
an editable install's import hook points elsewhere (a moved or deleted checkout broke builds so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = "- func: relu(Tensor self) -> Tensor\n  kernels: {cpu: at::cpu::relu}\n"
# What a stale editable install leaves: a meta-path hook, ahead of PYTHONPATH, that maps `opgen` to a
# source tree that no longer exists.
STALE_HOOK = """
import importlib.util, sys
class Stale:
    def find_spec(self, name, path=None, target=None):
        if name == "opgen" or name.startswith("opgen."):
            return importlib.util.spec_from_file_location(name, "/nonexistent/opgen/__init__.py")
sys.meta_path.insert(0, Stale())
"""


def test_a_stale_editable_hook_does_not_hijack_the_generator(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(STALE_HOOK)
    (tmp_path / "ops.yaml").write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = tmp_path / "out"
    command = ["gen", "--spec", str(tmp_path / "ops.yaml"), "--out", str(out)]
    hijacked = subprocess.run([sys.executable, "-m", "opgen", *command], env=env, capture_output=True, text=True)
    assert hijacked.returncode != 0 and "/nonexistent/opgen" in hijacked.stderr  # the hook is in force
    done = subprocess.run(
        [sys.executable, str(ROOT / "opgen/cmake/generate.py"), *command], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "1 bound functions" in done.stdout and (out / "module.cpp").is_file()
