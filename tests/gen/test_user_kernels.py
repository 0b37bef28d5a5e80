"""A user's own CMake project binds its own C++ kernel (`mylib::scaled_add`) through its own spec.

One build (module-scoped) serves every test: the happy path first, then the scenarios that break it
(each rewrites the spec, rebuilds, and checks that the failure names the spec's line), which restore it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")

CMAKELISTS = """
cmake_minimum_required(VERSION 3.18)
project(my_ops LANGUAGES CXX)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
execute_process(COMMAND "${Python_EXECUTABLE}" -m opgen cmake-dir OUTPUT_VARIABLE OPGEN_CMAKE_DIR
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
include("${OPGEN_CMAKE_DIR}/opgen.cmake")
opgen_add_extension(my_ops_ext SPEC "${CMAKE_CURRENT_SOURCE_DIR}/my_ops.yaml" MODULE _my SHARDS 1
                    SOURCES "${CMAKE_CURRENT_SOURCE_DIR}/src/scaled_add.cpp"
                    INCLUDE_DIRS "${CMAKE_CURRENT_SOURCE_DIR}/include" @EXTRA@)
"""

HEADER = """#pragma once
#include <ATen/core/Tensor.h>

namespace mylib {
at::Tensor scaled_add(const at::Tensor& self, const at::Tensor& other, double alpha);
void scaled_add_void(const at::Tensor& self, const at::Tensor& other, double alpha);  // declared, never bound
}  // namespace mylib
"""

SOURCE = """#include "mylib/scaled_add.h"

#include <ATen/ops/add.h>

namespace mylib {
at::Tensor scaled_add(const at::Tensor& self, const at::Tensor& other, double alpha) {
  return at::add(self, other, alpha);  // self + alpha * other
}
}  // namespace mylib
"""

SPEC = """- func: scaled_add(Tensor self, Tensor other, *, float alpha=1) -> Tensor
  kernels: {cpu: mylib::scaled_add}
  includes: [mylib/scaled_add.h]
  torch_op: mylib::scaled_add
  doc: self + alpha * other, by my own kernel.
"""


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


class Project:
    def __init__(self, root: Path) -> None:
        self.src, self.build = root / "src", root / "build"
        (self.src / "include" / "mylib").mkdir(parents=True)
        (self.src / "src").mkdir()
        (self.src / "include" / "mylib" / "scaled_add.h").write_text(HEADER)
        (self.src / "src" / "scaled_add.cpp").write_text(SOURCE)
        self.write(SPEC)

    def write(self, spec: str, extra: str = "") -> None:
        (self.src / "CMakeLists.txt").write_text(CMAKELISTS.replace("@EXTRA@", extra))
        (self.src / "my_ops.yaml").write_text(spec)

    def ninja(self) -> subprocess.CompletedProcess[str]:
        return run(["ninja"], self.build)

    def failed_build(self, spec: str, extra: str = "") -> str:
        """Build with `spec` (and `extra` arguments of opgen_add_extension), which must fail; its output."""
        self.write(spec, extra)
        result = self.ninja()
        assert result.returncode != 0, result.stdout[-3000:]
        return result.stdout + result.stderr

    def call(self, code: str) -> str:
        script = f"import sys, torch; sys.path.insert(0, {str(self.build)!r}); import _my; k = _my.kernel_ops; {code}"
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=self.build)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    project = Project(tmp_path_factory.mktemp("user_kernels"))
    configure = run(
        [
            *("cmake", "-G", "Ninja", "-S", str(project.src), "-B", str(project.build)),
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        project.src,
    )
    assert configure.returncode == 0, configure.stderr[-3000:]
    built = project.ninja()
    assert built.returncode == 0, built.stdout[-5000:]
    yield project


def test_user_kernel_matches_eager(project: Project) -> None:
    code = (
        "a, b = torch.randn(3, 4), torch.randn(3, 4); "
        "torch.testing.assert_close(k.scaled_add(a, b, alpha=2.5), a + 2.5 * b); "
        "print(torch.equal(k.scaled_add(a, b, alpha=2.5), torch.add(a, b, alpha=2.5)), "
        "torch.equal(k.scaled_add(a, b), a + b))"
    )
    assert project.call(code) == "True True"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ("torch.ones(2)", "TypeError"),  # a required argument missing
        ('torch.ones(2), "x"', "TypeError"),  # not a tensor
        ('torch.ones(2), torch.ones(2), alpha="x"', "TypeError"),  # not a float
        ("torch.ones(2), torch.ones(2), 3.0", "TypeError"),  # alpha is keyword-only
        ("torch.ones(2), torch.ones(3)", "RuntimeError"),  # the kernel's own error, translated
    ],
)
def test_bad_calls_raise_python_errors(project: Project, args: str, error: str) -> None:
    code = f"exec('try: k.scaled_add({args})\\nexcept Exception as e: print(type(e).__name__, e)')"
    out = project.call(code)
    assert out.startswith(error), out
    assert "scaled_add" in out, out


def test_registry_reports_the_torch_op(project: Project) -> None:
    code = (
        "i = k.get_kernel_op_info('scaled_add'); print(i['torch_op'], i['aten'], i['kernels'], i['location'], i['doc'])"
    )
    expected = "mylib.scaled_add.default mylib::scaled_add {'cpu': 'mylib::scaled_add'} my_ops.yaml:1 " + (
        "self + alpha * other, by my own kernel."
    )
    assert project.call(code) == expected


def test_bad_specs_fail_the_build_at_the_spec_line(project: Project) -> None:
    # A spec error (a user kernel without its headers) fails the generator, before any compiling.
    out = project.failed_build(SPEC.replace("  includes: [mylib/scaled_add.h]\n", ""))
    assert "my_ops.yaml:2: op 'scaled_add': cpu kernel 'mylib::scaled_add' is a user kernel" in out

    # A kernel the header does not declare: the compiler's error, at the spec's line.
    out = project.failed_build(SPEC.replace("mylib::scaled_add}", "mylib::scaled_ad}"))
    assert "my_ops.yaml:1:" in out and "scaled_ad" in out, out[-3000:]

    # A header that is not there: an #error naming the spec line and the header.
    out = project.failed_build(SPEC.replace("mylib/scaled_add.h", "mylib/nope.h"))
    assert "my_ops.yaml:1: op 'scaled_add': header <mylib/nope.h> (its 'includes') not found" in out, out[-3000:]

    # Kernels whose signature does not fit the schema: a static_assert naming the line and the signature.
    mismatched = SPEC.replace(", *, float alpha=1", "").replace("torch_op: mylib::scaled_add", "python: f") + (
        "- func: g(Tensor self, Tensor other, float alpha) -> Tensor\n"
        "  kernels: {cpu: mylib::scaled_add_void}\n"
        "  includes: [mylib/scaled_add.h]\n"
    )
    out = project.failed_build(mismatched)
    assert (
        "my_ops.yaml:1: kernel mylib::scaled_add must be callable as at::Tensor(const at::Tensor& self, "
        "const at::Tensor& other)" in out
    ), out[-3000:]
    assert (
        "my_ops.yaml:6: kernel mylib::scaled_add_void must be callable as at::Tensor(const at::Tensor& self, "
        "const at::Tensor& other, double alpha)" in out
    ), out[-3000:]

    # A library that does not exist: the linker's error (opgen passes LIBRARIES to target_link_libraries as is).
    out = project.failed_build(SPEC, extra="LIBRARIES opgen_no_such_library")
    assert "opgen_no_such_library" in out, out[-3000:]

    project.write(SPEC)
    rebuilt = project.ninja()
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:]
    assert project.call("print(k.scaled_add(torch.ones(2), torch.ones(2), alpha=3.0).tolist())") == "[4.0, 4.0]"
