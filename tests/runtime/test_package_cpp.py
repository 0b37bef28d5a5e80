"""A C++ program built with CMake against opgen's package API runs packages with no Python in the process.

The slow build test of the package: it configures and builds tests/runtime/package_cpp (the
executor, its thunks generated from ops.yaml, the package reader and a small main, against
libtorch: about a minute on 2 cores), then runs a packaged MLP and a ResNet-style CNN and compares
their outputs with eager PyTorch. It runs in the normal suite wherever cmake and a C++ compiler are
(`-m "not slow_build"` leaves it out); without them it skips, saying which is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_package import model_and_input, package_calling_python, package_taking_an_object

import opgen
from opgen import _C
from opgen.runtime.artifact.package_file import replace_header

PROJECT = Path(__file__).resolve().parent / "package_cpp"
COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
# On PATH, or beside the interpreter (a virtual environment's pip-installed cmake, not activated).
CMAKE = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))

pytestmark = [
    pytest.mark.slow_build,
    pytest.mark.skipif(CMAKE is None, reason="needs cmake (pip install cmake)"),
    pytest.mark.skipif(COMPILER is None, reason="needs a C++ compiler"),
]


def run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built `run_package` executable (configure + build timed, printed with -s)."""
    build = tmp_path_factory.mktemp("package_cpp") / "build"
    start = time.perf_counter()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = run(
        [str(CMAKE), *generator, "-S", str(PROJECT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}"],
        build.parent,
    )  # fmt: skip
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    configured = time.perf_counter()
    built = run([str(CMAKE), "--build", str(build), "-j", str(os.cpu_count() or 2)], build.parent)
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-3000:]
    print(f"\nrun_package: configured in {configured - start:.1f} s, built in {time.perf_counter() - configured:.1f} s")
    return build / "run_package"


def test_the_program_has_no_python_in_it(program: Path) -> None:
    if shutil.which("ldd") is None:
        pytest.skip("needs ldd")
    linked = run(["ldd", str(program)], program.parent).stdout
    assert "libtorch_cpu" in linked
    assert "libpython" not in linked and "libtorch_python" not in linked, linked


@pytest.mark.parametrize("name", ["mlp", "resnet"])
def test_packages_run_in_cpp_as_in_eager(name: str, program: Path, tmp_path: Path) -> None:
    model, x = model_and_input(name)
    path = opgen.package(model, (x,), tmp_path / f"{name}.opgen")
    x.numpy().tofile(tmp_path / "x.bin")
    result = run([str(program), str(path), str(tmp_path / "out"), str(tmp_path / "x.bin")], tmp_path, 120)
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        expected = model(x)
    assert f"output 0 Float {list(expected.shape)}".replace(" ", "") in result.stdout.replace(" ", "")
    got = torch.from_numpy(np.fromfile(tmp_path / "out0.bin", dtype=np.float32)).view(expected.shape)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    print(f"\n{name}: {result.stdout.splitlines()[-1]}")  # load_ms ... first_run_ms ...


def test_cpp_refuses_bad_packages_with_the_same_messages(program: Path, tmp_path: Path) -> None:
    model, x = model_and_input("mlp")
    path = opgen.package(model, (x,), tmp_path / "mlp.opgen")
    data = path.read_bytes()
    cases = {
        "corrupt.opgen": (data[:-5] + bytes([data[-5] ^ 0x40]) + data[-4:], "constant 'fc2.bias' fails its checksum"),
        "truncated.opgen": (data[: len(data) // 2], "truncated:"),
        "torch.opgen": (replace_header(data, _C.crc32c, torch="2.1.0"), "made with torch 2.1.0, but this runtime has"),
        "spec.opgen": (replace_header(data, _C.crc32c, thunks="0123456789abcdef"), "made for another op spec"),
        "text.opgen": (b"hello\n", "not an opgen package"),
    }
    with pytest.MonkeyPatch.context() as monkeypatch:
        calling = package_calling_python(tmp_path / "calling.opgen", monkeypatch).read_bytes()
    cases["python.opgen"] = (calling, "calls functions bound at load time (f), which a package running without")
    with pytest.MonkeyPatch.context() as monkeypatch:
        objects = package_taking_an_object(tmp_path / "objects.opgen", monkeypatch).read_bytes()
    cases["objects.opgen"] = (objects, "takes the object input(s) 'x' (torch.compile's DTensor specs)")
    for file, (content, message) in cases.items():
        (tmp_path / file).write_bytes(content)
        result = run([str(program), str(tmp_path / file), str(tmp_path / "out")], tmp_path, 60)
        assert result.returncode == 1, (file, result.stdout, result.stderr)
        assert f"opgen package {tmp_path / file}: " in result.stderr and message in result.stderr, result.stderr


def test_cpp_refuses_wrong_inputs_naming_the_input(program: Path, tmp_path: Path) -> None:
    model, x = model_and_input("mlp")
    path = opgen.package(model, (x,), tmp_path / "mlp.opgen")
    x.numpy().tofile(tmp_path / "x.bin")
    result = run([str(program), str(path), str(tmp_path / "out"), str(tmp_path / "x.bin"), "--double"], tmp_path, 60)
    assert result.returncode == 1, result.stdout
    assert "(mlp.opgen" in result.stderr or "mlp.opgen)" in result.stderr, result.stderr
    assert "input 'x' (position 1): expected dtype float32, got float64" in result.stderr, result.stderr
    missing = run([str(program), str(path), str(tmp_path / "out")], tmp_path, 60)  # no input file
    assert missing.returncode == 1 and "takes 1 input tensors, got 0" in missing.stderr, missing.stderr


def test_repeated_runs_report_a_cpp_callers_time_per_run(program: Path, tmp_path: Path) -> None:
    """`--repeat=N`: the per-call time of the C++ backend called from C++ (single_add's package), the
    figure `graphs`' hand-written C++ loop is held against (printed with -s; no timed assertion)."""
    from opgen.bench.models import SingleAdd

    x, y = torch.randn(16), torch.randn(16)
    path = opgen.package(SingleAdd(), (x, y), tmp_path / "single_add.opgen")
    x.numpy().tofile(tmp_path / "x.bin")
    y.numpy().tofile(tmp_path / "y.bin")
    argv = [str(program), str(path), str(tmp_path / "out"), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")]
    result = run([*argv, "--repeat=100000"], tmp_path, 120)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("us_per_run ")]
    assert float(line.split()[1]) > 0
    got = torch.from_numpy(np.fromfile(tmp_path / "out0.bin", dtype=np.float32))
    torch.testing.assert_close(got, x + y)  # the first run's result, written before the repeats
    print(f"\nsingle_add from C++: {line} us")
