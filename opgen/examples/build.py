"""Build the example projects shipped with opgen (no torch imported here: CMake and ninja do the work).

`build_user_kernels(build_dir)` configures `opgen/examples/user_kernels` (a project of your own kernels,
docs/spec.md) into `build_dir` with CMake and builds it with ninja; the folder it returns holds the
module `my_ops`. A build folder already configured for this project and interpreter is reused, and
ninja rebuilds only what changed.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from opgen.disk import cache_dir

USER_KERNELS = Path(__file__).resolve().parent / "user_kernels"
MODULE = "my_ops"
LOG = "opgen-build.log"  # in the build folder: the last configure's and build's whole output
TAIL_LINES = 40


class ExampleBuildError(RuntimeError):
    """An example project could not be built: tools missing, or CMake or ninja failed (the message ends
    with the last lines of their output; the whole output is in the build folder's opgen-build.log)."""


def default_build_dir() -> Path:
    """Where opgen's own tools build the example: OPGEN_CACHE_DIR/examples/user_kernels-<key>, one per
    copy of the example and interpreter (a build serves the interpreter it was configured with)."""
    key = hashlib.sha256(f"{USER_KERNELS}\0{sys.executable}".encode()).hexdigest()[:12]
    return cache_dir() / "examples" / f"user_kernels-{key}"


def build_user_kernels(build_dir: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Build the example project of your own kernels into `build_dir`; returns the folder holding `my_ops`
    (put it on sys.path, import torch, then `import my_ops`). `progress` gets a line before the configure
    step (skipped when `build_dir` is configured already) and one before the build. Raises
    ExampleBuildError when cmake or ninja is missing or the build fails."""
    say = progress or (lambda line: None)
    missing = [tool for tool in ("cmake", "ninja") if shutil.which(tool) is None]
    if missing:
        raise ExampleBuildError(f"building the user-kernels example needs {' and '.join(missing)} on PATH")
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / LOG
    log.write_text("")
    if not _configured(build_dir):
        say(f"opgen: configuring the user-kernels example in {build_dir} (cmake)")
        configure = [
            *("cmake", "-G", "Ninja", "-S", str(USER_KERNELS), "-B", str(build_dir)),
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DOPGEN_CMAKE_DIR={Path(__file__).resolve().parents[1] / 'cmake'}",
        ]
        _run(configure, log, "cmake (configure)")
    say(f"opgen: building {MODULE} in {build_dir} (ninja; a first build takes a minute or two)")
    _run(["ninja", "-C", str(build_dir)], log, "ninja (build)")
    if not any((build_dir / f"{MODULE}{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        raise ExampleBuildError(f"the build in {build_dir} succeeded but made no {MODULE} module; see {log}")
    return build_dir


def _configured(build_dir: Path) -> bool:
    """`build_dir` holds a finished configure of this project with this interpreter."""
    cache = build_dir / "CMakeCache.txt"
    if not (build_dir / "build.ninja").is_file() or not cache.is_file():
        return False
    entries = {}
    for line in cache.read_text(errors="replace").splitlines():  # NAME:TYPE=VALUE
        name, equals, value = line.partition("=")
        if equals and not line.startswith(("#", "//")):
            entries[name.partition(":")[0]] = value
    wanted = {"CMAKE_HOME_DIRECTORY": str(USER_KERNELS), "Python_EXECUTABLE": sys.executable}
    return all(entries.get(name) == value for name, value in wanted.items())


def _run(command: list[str], log: Path, step: str) -> None:
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n{result.stdout}\n")
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-TAIL_LINES:])
        raise ExampleBuildError(
            f"building the user-kernels example failed at {step} (exit {result.returncode}); "
            f"whole output in {log}; its last lines:\n{tail}"
        )
