"""A user's own CMake project builds its own kernel_ops from its own spec with opgen.cmake.

Also proves the build-step contract: editing the spec and rebuilding regenerates the bindings, and
a bad spec fails the build with the spec's own error message.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CMAKELISTS = """
cmake_minimum_required(VERSION 3.18)
project(my_ops LANGUAGES CXX)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
execute_process(COMMAND "${Python_EXECUTABLE}" -m opgen cmake-dir OUTPUT_VARIABLE OPGEN_CMAKE_DIR
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
include("${OPGEN_CMAKE_DIR}/opgen.cmake")
opgen_add_extension(my_ops_ext SPEC "${CMAKE_CURRENT_SOURCE_DIR}/my_ops.yaml" MODULE _my SHARDS 1)
"""

SPEC = """
- func: mul.Tensor(Tensor self, Tensor other) -> Tensor
  python: times
  kernels: {cpu: at::cpu::mul}
  doc: My own multiply.
"""

SPEC_EDITED = (
    SPEC
    + """
- func: neg(Tensor self) -> Tensor
  kernels: {cpu: at::cpu::neg}
- func: scale_(Tensor(a!) self, float f) -> Tensor(a!)
  triton:
    kernel: my_ops.kernels:scale
    args: {x: self, n: numel(self), f: f}
    grid: ['cdiv(n, BLOCK)']
    configs: [{BLOCK: 256}]
"""
)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def call(build: Path, code: str) -> str:
    script = f"import sys, torch; sys.path.insert(0, {str(build)!r}); import _my; k = _my.kernel_ops; {code}"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=build)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_user_project_builds_regenerates_and_rejects_bad_spec(tmp_path: Path) -> None:
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    (src / "my_ops.yaml").write_text(SPEC)
    configure = run(
        [
            "cmake",
            "-G",
            "Ninja",
            "-S",
            str(src),
            "-B",
            str(build),
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        tmp_path,
    )
    assert configure.returncode == 0, configure.stderr[-3000:]
    assert run(["ninja"], build).returncode == 0
    assert call(build, "print(k.times(torch.full([2], 3.0), torch.full([2], 2.0)).tolist())") == "[6.0, 6.0]"
    assert call(build, "print(k.get_kernel_op_info('times')['doc'])") == "My own multiply."

    (src / "my_ops.yaml").write_text(SPEC_EDITED)
    rebuild = run(["ninja"], build)
    assert rebuild.returncode == 0, rebuild.stdout[-3000:]
    assert "opgen: generating kernel_ops bindings" in rebuild.stdout
    assert (
        call(build, "print(k.neg(torch.ones(1)).tolist(), sorted(k.get_kernel_op_names()))")
        == "[-1.0] ['neg', 'scale_', 'times']"
    )
    # A Triton op binds like any other; on CPU tensors it refuses (a CPU build: for want of a launcher).
    refused = call(build, "exec('try: k.scale_(torch.ones(2), 2.0)\\nexcept RuntimeError as e: print(e)')")
    assert re.match(r"kernel_ops\.scale_\(\): (runs a Triton kernel|argument 'self' is on cpu)", refused), refused

    (src / "my_ops.yaml").write_text(SPEC.replace("Tensor other", "Tensr other"))
    failed = run(["ninja"], build)
    assert failed.returncode != 0
    assert "my_ops.yaml:2: op 'mul.Tensor': arg 'other': unknown type 'Tensr'" in failed.stdout + failed.stderr
