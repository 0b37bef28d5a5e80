"""The README's two commands where pip may not install into the system Python (PEP 668).

`tools/python_env.sh` picks the interpreter `make` installs into: $PYTHON itself where pip may
install into it, else a local virtual environment it creates (and later reuses), saying so. Here
an externally managed Python is stood in for by a wrapper that answers the script's PEP 668 probe
(`python -`, reading the check from stdin) with "managed" and runs the real interpreter otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = getattr(sys, "_base_executable", sys.executable)  # not a venv's: the probe must not see one


def python_env(python: str, venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": python, "OPGEN_VENV": str(venv)}
    return subprocess.run(
        ["sh", "tools/python_env.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True
    )


def managed_python(tmp_path: Path) -> str:
    wrapper = tmp_path / "python3"
    wrapper.write_text(
        f'#!/bin/sh\n[ "$1" = "-" ] && exit 1  # the PEP 668 probe: "externally managed"\nexec {BASE} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def test_an_installable_python_is_used_as_it_is(tmp_path: Path) -> None:
    done = python_env(sys.executable, tmp_path / "venv")  # the suite runs in a venv (or as make chose)
    if sys.prefix == sys.base_prefix:
        return  # a system Python the suite runs in may itself be managed; the venv case is below
    assert done.stdout.strip() == sys.executable
    assert done.stderr == ""
    assert not (tmp_path / "venv").exists()


def test_a_managed_python_gets_a_local_venv_that_both_commands_then_use(tmp_path: Path) -> None:
    python, venv = managed_python(tmp_path), tmp_path / "venv"
    first = python_env(python, venv)
    assert first.stdout.strip() == f"{venv}/bin/python"
    assert "is externally managed (PEP 668); creating a virtual environment in" in first.stderr
    probe = "import sys, torch, pip; print(sys.prefix != sys.base_prefix)"
    check = subprocess.run([f"{venv}/bin/python", "-c", probe], capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "True", check.stderr  # a venv, with pip, seeing the system's torch
    again = python_env(python, venv)
    assert again.stdout == first.stdout
    assert "using the virtual environment in" in again.stderr
    env = {**os.environ, "OPGEN_VENV": str(venv)}
    for target, command in (("demo", "-m opgen.demo"), ("test", "-m pytest")):
        done = subprocess.run(
            ["make", "-n", target, f"PYTHON={python}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()  # what `make demo` / `make test` would run: all in the venv
        assert any(line.startswith(f"{venv}/bin/python -m pip install") for line in lines), lines
        assert any(line.startswith(f"{venv}/bin/python {command}") for line in lines), lines
