"""The example project shipped as package data (opgen/examples/user_kernels) builds with build_user_kernels, and
its module binds the user's kernel both ways: directly (`my_ops.kernel_ops.scaled_add`) and through the
dispatcher (`torch.ops.mylib.scaled_add`, with a Meta kernel for tracing).

One build per test run (tests/conftest.py: user_kernels_build) serves every test; the calls run in a subprocess, so the
module's torch.library registrations stay out of this process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opgen.examples import USER_KERNELS, ExampleBuildError, build_user_kernels

pytestmark = [
    pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("cmake") is None, reason="needs cmake and ninja"),
    pytest.mark.slow_build,
]


@pytest.fixture
def build_dir(user_kernels_build: Path) -> Path:
    return user_kernels_build  # one build per test run (tests/conftest.py), shared with tests/runtime/test_user_ops.py


def call(build_dir: Path, code: str) -> str:
    script = f"import sys; sys.path.insert(0, {str(build_dir)!r}); import torch, my_ops; k = my_ops.kernel_ops\n{code}"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_the_project_is_package_data() -> None:
    for name in (
        "CMakeLists.txt",
        "my_ops.yaml",
        "my_ops_cuda.yaml",
        "include/mylib/scaled_add.h",
        "python/mylib_triton.py",
    ):
        assert (USER_KERNELS / name).is_file(), name
    for name in ("scaled_add.cpp", "register.cpp", "scaled_add_cuda.cu"):
        assert (USER_KERNELS / "src" / name).is_file(), name


def test_both_ways_compute_self_plus_alpha_other(build_dir: Path) -> None:
    code = (
        "a, b = torch.randn(3, 4), torch.randn(3, 4)\n"
        "for f in (k.scaled_add, torch.ops.mylib.scaled_add):\n"
        "    torch.testing.assert_close(f(a, b, alpha=2.5), a + 2.5 * b)\n"
        "    torch.testing.assert_close(f(a, b), a + b)\n"
        "    torch.testing.assert_close(f(a, b[0], alpha=-1.0), a - b[0])  # broadcast\n"
        "print(k.get_kernel_op_info('scaled_add')['torch_op'])"
    )
    assert call(build_dir, code) == "mylib.scaled_add.default"


def test_the_torch_op_runs_on_meta_tensors(build_dir: Path) -> None:
    code = (
        "a, b = torch.empty(2, 1, device='meta'), torch.empty(3, dtype=torch.float64, device='meta')\n"
        "r = torch.ops.mylib.scaled_add(a, b, alpha=2.0)\n"
        "print(r.device, tuple(r.shape), r.dtype)"
    )
    assert call(build_dir, code) == "meta (2, 3) torch.float64"


def test_an_up_to_date_build_is_reused(build_dir: Path) -> None:
    lines: list[str] = []
    assert build_user_kernels(build_dir, progress=lines.append) == build_dir
    assert [line.split()[1] for line in lines] == ["building"], lines  # configured already: no cmake
    assert "ninja: no work to do." in (build_dir / "opgen-build.log").read_text()


def test_a_failed_build_names_the_step_and_ends_with_its_output(tmp_path: Path) -> None:
    (tmp_path / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={tmp_path / 'elsewhere'}\n")
    with pytest.raises(ExampleBuildError, match=r"failed at cmake \(configure\) \(exit 1\)") as failed:
        build_user_kernels(tmp_path)
    assert "does not match the source" in str(failed.value), failed.value
