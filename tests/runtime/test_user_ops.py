"""The runtime calls a user's own kernel: the example project's `mylib::scaled_add` (opgen/examples/user_kernels,
a torch.library op and an entry of the project's spec), in a model compiled strictly by opgen.compile, by the
torch.compile backend and into a package; on a GPU, its CUDA kernel in CUDA-graph mode.

One build of the project per test run (tests/conftest.py: user_kernels_build); each scenario runs in a
child process (`user_ops_child.py`), since importing the extension registers it for the rest of the process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opgen

pytestmark = [
    pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("cmake") is None, reason="needs cmake and ninja"),
    pytest.mark.slow_build,
]
CHILD = Path(__file__).with_name("user_ops_child.py")
CUDA = torch.cuda.is_available() and shutil.which("nvcc") is not None


@pytest.fixture
def build(user_kernels_build: Path) -> Path:
    return user_kernels_build


def child(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPGEN_CACHE_DIR": str(build / "opgen-cache")}
    return subprocess.run(
        [sys.executable, str(CHILD), str(build), *args], capture_output=True, text=True, timeout=600, env=env,
        cwd=build.parent,
    )  # fmt: skip


def ok(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return [line for line in result.stdout.splitlines() if line.startswith("OK ")]


def test_opgen_compile_calls_the_users_kernel_strictly_on_both_backends(build: Path) -> None:
    assert ok(child(build, "compile")) == ["OK compile python cpu", "OK compile cpp cpu"]


def test_the_torch_compile_backend_calls_the_users_kernel(build: Path) -> None:
    assert ok(child(build, "backend")) == ["OK torch.compile cpu"]


def test_a_package_names_the_extension_and_loading_imports_it(build: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.opgen"
    assert ok(child(build, "package", str(path))) == ["OK package"]
    assert ok(child(build, "load", str(path))) == ["OK load"]


def test_loading_a_package_without_its_extension_says_which(build: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.opgen"
    ok(child(build, "package", str(path)))
    with pytest.raises(opgen.PackageError, match=r"extension module 'my_ops', which cannot be imported here"):
        opgen.load_package(path)  # this process has no my_ops on its path


@pytest.mark.skipif(not CUDA, reason="needs a GPU and nvcc")
def test_the_users_cuda_kernel_runs_in_cuda_graph_mode_and_its_triton_kernel_competes(build: Path) -> None:
    lines = ok(child(build, "compile_cuda"))
    expected = [
        *("OK compile python cuda", "OK compile cpp cuda", "OK compile kernel_choice"),
        *("OK compile cuda_graphs", "OK captured"),
    ]
    assert lines == expected
    assert ok(child(build, "backend_cuda")) == ["OK torch.compile cuda"]


@torch.library.custom_op("opgen_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsTwice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.opgen_test.twice(x) + 1


def test_an_unbound_custom_op_says_how_to_bind_it() -> None:
    x = torch.randn(4)
    with torch.no_grad(), pytest.raises(opgen.UnsupportedOpError) as error:
        opgen.compile(CallsTwice(), (x,), cache=False)
    message = str(error.value)
    assert "op opgen_test.twice.default has no binding in kernel_ops or an imported extension" in message
    assert "python -m opgen.draft opgen_test" in message and "torch_op: opgen_test::twice" in message
    with torch.no_grad():
        fast = opgen.compile(CallsTwice(), (x,), cache=False, fallback=True)
    torch.testing.assert_close(fast(x), x * 2 + 1)
