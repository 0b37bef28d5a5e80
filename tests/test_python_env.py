"""The README's two commands where pip may not install into the system Python (PEP 668).

`tools/python_env.sh` picks the interpreter `make` installs into: $PYTHON itself where pip may
install into it, else a local virtual environment it creates (and later reuses), saying so. Here
an externally managed Python is stood in for by a wrapper that answers the script's PEP 668 probe
(`python -`, reading the check from stdin) with "managed" and runs the real interpreter otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE = getattr(sys, "_base_executable", sys.executable)  # not a venv's: the probe must not see one


def python_env(python: str, venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": python, "OPGEN_VENV": str(venv)}
    return subprocess.run(
        ["sh", "tools/python_env.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True
    )


SEES = (
    "import importlib.util, json, site, sys; print(json.dumps({'venv': sys.prefix != sys.base_prefix, "
    "'path': sys.path, 'site': site.getsitepackages(), 'pip': importlib.util.find_spec('pip') is not None, "
    "'torch': importlib.util.find_spec('torch') is not None}))"
)


def sees(python: str) -> dict[str, Any]:
    """What `python` is and can import: venv or not, sys.path, its site directories, pip and torch found."""
    done = subprocess.run([python, "-c", SEES], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


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
    # A venv with pip that sees the managed Python's packages (--system-site-packages): its torch where it
    # has one. That Python is the base of the suite's own interpreter, which lacks torch where the suite
    # runs in a venv of its own (`python3 -m venv venv; PYTHON=venv/bin/python make test`).
    base, made = sees(BASE), sees(f"{venv}/bin/python")
    assert made["venv"] and made["pip"], made
    assert {d for d in base["site"] if os.path.isdir(d)} <= set(made["path"]), (base["site"], made["path"])
    assert made["torch"] == base["torch"], (base, made)
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
