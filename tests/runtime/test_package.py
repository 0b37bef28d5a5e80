"""opgen.package / opgen.load_package: round trips against eager PyTorch, and every error a package can give.

The file is read by the C++ reader (csrc/opgen/package/package.cpp) that a C++ program uses too;
test_package_cpp.py builds such a program with CMake and runs packages with no Python in it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import opgen
from opgen import _C
from opgen.runtime.artifact import setup_folding
from opgen.runtime.artifact.package_file import FORMAT, replace_header
from opgen.runtime.codegen.backend import Printed
from opgen.runtime.errors import InputMismatchError, InputTypeError, PackageError
from opgen.runtime.frontend import packaging as package_module


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Block(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(torch.nn.Module):
    """A ResNet-style CNN: stem, two residual blocks, pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16))
        self.blocks = torch.nn.Sequential(Block(16), Block(16))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.blocks(x), 1), 1))


class TwoHeads(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": x + y, "prod": [x * y, (x - y).relu()]}


def model_and_input(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().eval(), torch.randn(4, 32)
    model = SmallResNet().eval()
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):  # statistics not 0 and 1
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(2, 3, 32, 32)


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, x = model_and_input("mlp")
    return opgen.package(model, (x,), tmp_path_factory.mktemp("pkg") / "mlp.opgen")


@pytest.mark.parametrize("name", ["mlp", "resnet"])
def test_round_trip_matches_eager(name: str, tmp_path: Path) -> None:
    model, x = model_and_input(name)
    path = opgen.package(model, (x,), tmp_path / f"{name}.opgen")
    fn = opgen.load_package(path)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(fn(x), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fn(x * 2), model(x * 2).detach(), rtol=1e-4, atol=1e-4)  # the second call too
    assert type(fn).__name__ == "CppFunction"  # the C++ executor runs it
    assert fn.package.name == type(model).__name__ and fn.package.thunk_digest == _C.THUNK_DIGEST
    assert fn.package.inputs[0].shape == tuple(x.shape)


def test_outputs_keep_their_structure_and_several_inputs(tmp_path: Path) -> None:
    x, y = torch.randn(5), torch.randn(5)
    fn = opgen.load_package(opgen.package(TwoHeads(), (x, y), tmp_path / "heads.opgen"))
    out = fn(x, y)
    assert sorted(out) == ["prod", "sum"] and isinstance(out["prod"], list)
    torch.testing.assert_close(out["sum"], x + y)
    torch.testing.assert_close(out["prod"][1], (x - y).relu())


def test_the_file_is_self_contained(tmp_path: Path) -> None:
    """The model's weights changing, or the model being gone, changes nothing: the package holds its own."""
    model, x = model_and_input("mlp")
    path = opgen.package(model, (x,), tmp_path / "mlp.opgen")
    expected = model(x).detach()
    with torch.no_grad():
        model.fc1.weight.zero_()
    del model
    torch.testing.assert_close(opgen.load_package(path)(x), expected, rtol=1e-4, atol=1e-4)
    assert not list(tmp_path.glob("*.tmp"))  # written atomically, nothing left behind


def test_constants_lie_in_the_mapped_file_and_writes_stay_private(mlp_package: Path) -> None:
    """The reader maps the file: constants are tensors over its pages, aligned; writing one writes a
    private copy, never the file or another load's tensors."""
    before = mlp_package.read_bytes()
    first, second = _C.read_package(str(mlp_package)), _C.read_package(str(mlp_package))
    weight = first["constants"][0]
    assert weight.data_ptr() % 64 == 0 and weight.numel() > 0
    kept = weight.clone()
    weight.add_(1.0)
    torch.testing.assert_close(second["constants"][0], kept)
    torch.testing.assert_close(_C.read_package(str(mlp_package))["constants"][0], kept)
    assert mlp_package.read_bytes() == before


def test_checksums_are_crc32c() -> None:
    assert _C.crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C
    assert _C.crc32c(b"") == 0 and _C.crc32c(bytes(1000)) != _C.crc32c(bytes(1001))


# -- refused when packaging ------------------------------------------------------------------------


def test_dynamic_shapes_are_refused_saying_why(tmp_path: Path) -> None:
    model, x = model_and_input("mlp")
    dims = ({0: torch.export.Dim("batch", min=2, max=64)},)
    with pytest.raises(PackageError, match=r"dynamic_shapes is not supported: a package holds static shapes"):
        opgen.package(model, (x,), tmp_path / "d.opgen", dynamic_shapes=dims)
    assert not (tmp_path / "d.opgen").exists()


def test_a_graph_the_executor_cannot_run_is_refused_naming_what(tmp_path: Path, monkeypatch) -> None:
    real = package_module.compile_graph

    def without_cpp(*args, **kwargs):
        graph, filename = real(*args, **kwargs)
        refused = (("cpp", Printed(error="the Python function py:f (node f_1)")),)
        return dataclasses.replace(graph, printed=refused), filename

    monkeypatch.setattr(package_module, "compile_graph", without_cpp)
    model, x = model_and_input("mlp")
    message = "MLP cannot run on the C\\+\\+ executor: the Python function py:f \\(node f_1\\)"
    with pytest.raises(PackageError, match=message):
        opgen.package(model, (x,), tmp_path / "m.opgen", cache=False)


def test_non_tensor_outputs_and_inputs_are_refused(tmp_path: Path) -> None:
    class Count(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
            return x + 1, 3

    with pytest.raises(PackageError, match=r"returns 3, not a tensor"):
        opgen.package(Count(), (torch.randn(2),), tmp_path / "c.opgen")
    with pytest.raises(InputTypeError, match=r"example input 1 is int"):
        opgen.package(MLP(), (3,), tmp_path / "i.opgen")


# -- refused when loading --------------------------------------------------------------------------


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.opgen"
    path.write_bytes(data)
    return path


def test_truncated_file(mlp_package: Path, tmp_path: Path) -> None:
    data = mlp_package.read_bytes()
    with pytest.raises(PackageError, match=r"bad.opgen: truncated: \d+ bytes, expected \d+"):
        opgen.load_package(write(tmp_path, data[: len(data) // 2]))
    with pytest.raises(PackageError, match=r"truncated"):
        opgen.load_package(write(tmp_path, data[:40]))  # inside the header


def test_corrupt_file(mlp_package: Path, tmp_path: Path) -> None:
    data = bytearray(mlp_package.read_bytes())
    header_end = data.index(b"\ndata ")
    data[header_end - 3] ^= 0x01
    with pytest.raises(PackageError, match=r"corrupt header \(checksum mismatch\)"):
        opgen.load_package(write(tmp_path, bytes(data)))
    data = bytearray(mlp_package.read_bytes())
    data[-5] ^= 0x40  # the last constant's bytes (fc2.bias)
    with pytest.raises(PackageError, match=r"corrupt: constant 'fc2.bias' fails its checksum"):
        opgen.load_package(write(tmp_path, bytes(data)))
    with pytest.raises(PackageError, match=r"corrupt: \d+ bytes where the header says \d+"):
        opgen.load_package(write(tmp_path, mlp_package.read_bytes() + b"\0"))


def package_edited(path: Path, monkeypatch: pytest.MonkeyPatch, edit: Callable[[str], str]) -> Path:
    """An MLP's package with its program edited, written past the checks that keep `opgen.package`
    from writing such a program."""
    original = setup_folding.fold

    def edited(*args: Any) -> setup_folding.Folded:
        folded = original(*args)
        return dataclasses.replace(folded, program=edit(folded.program))

    monkeypatch.setattr(setup_folding, "fold", edited)
    model, x = model_and_input("mlp")
    return opgen.package(model, (x,), path)


def package_calling_python(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A program calling an extern `f`, as a graph with Triton kernels does in its own process."""
    return package_edited(path, monkeypatch, lambda program: program.replace("\nsetup:", "\nextern f\nsetup:", 1))


def package_taking_an_object(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A program whose input is an object it never reads, as torch.compile passes DTensor specs."""
    line = re.compile(r"^input r0 x .*$", re.M)
    return package_edited(path, monkeypatch, lambda text: line.sub("input r0 x opaque", text))


def test_a_program_calling_python_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = package_calling_python(tmp_path / "python.opgen", monkeypatch)
    with pytest.raises(PackageError, match=r"calls functions bound at load time \(f\), which a package running"):
        opgen.load_package(path)


def test_a_program_taking_objects_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = package_taking_an_object(tmp_path / "objects.opgen", monkeypatch)
    with pytest.raises(PackageError, match=r"takes the object input\(s\) 'x' \(torch.compile's DTensor specs\)"):
        opgen.load_package(path)


def test_another_torch_version(mlp_package: Path, tmp_path: Path) -> None:
    other = replace_header(mlp_package.read_bytes(), _C.crc32c, torch="2.1.0+cpu")
    message = f"made with torch 2.1.0\\+cpu, but this runtime has torch {torch.__version__.split('+')[0]}"
    with pytest.raises(PackageError, match=message):
        opgen.load_package(write(tmp_path, other))


def test_another_op_spec(mlp_package: Path, tmp_path: Path) -> None:
    other = replace_header(mlp_package.read_bytes(), _C.crc32c, thunks="0123456789abcdef")
    message = f"made for another op spec: .* thunks 0123456789abcdef .* this runtime's thunks are {_C.THUNK_DIGEST}"
    with pytest.raises(PackageError, match=message):
        opgen.load_package(write(tmp_path, other))


def test_another_package_format(mlp_package: Path, tmp_path: Path) -> None:
    data = mlp_package.read_bytes().replace(f"opgen-package {FORMAT} ".encode(), b"opgen-package 7 ", 1)
    with pytest.raises(PackageError, match=f"written in package format 7; this opgen reads format {FORMAT}"):
        opgen.load_package(write(tmp_path, data))


@pytest.mark.parametrize("content", [b"", b"hello\n", b"\x80\x02}q\x00.", b"opgen-packag"], ids=repr)
def test_not_a_package(content: bytes, tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=r"not an opgen package"):
        opgen.load_package(write(tmp_path, content))


def test_a_torch_save_file_or_no_file(tmp_path: Path) -> None:
    torch.save(MLP().state_dict(), tmp_path / "weights.pt")
    with pytest.raises(PackageError, match=r"weights.pt: not an opgen package"):
        opgen.load_package(tmp_path / "weights.pt")
    with pytest.raises(PackageError, match=r"missing.opgen: cannot open it for reading"):
        opgen.load_package(tmp_path / "missing.opgen")


# -- wrong inputs ----------------------------------------------------------------------------------


def test_wrong_inputs_name_the_input(mlp_package: Path) -> None:
    fn = opgen.load_package(mlp_package)
    x = torch.randn(4, 32)
    with pytest.raises(
        InputTypeError, match=r"input 'x' \(position 1\): expected dtype torch.float32, got torch.float64"
    ):
        fn(x.double())
    with pytest.raises(InputMismatchError, match=r"compiled for shape \(4, 32\) .* got shape \(5, 32\).* made for"):
        fn(torch.randn(5, 32))
    with pytest.raises(InputMismatchError, match=r"expected a 2-d tensor"):
        fn(torch.randn(4, 32, 1))
    with pytest.raises(InputTypeError, match=r"takes 1 positional arguments but 2 were given"):
        fn(x, x)
    with pytest.raises(InputTypeError, match=r"must be a torch.Tensor, got list"):
        fn([1.0])
    with pytest.raises(InputMismatchError, match=r"with strides \(32, 1\), got .* strides \(1, 4\)"):
        fn(torch.randn(32, 4).t())
    torch.testing.assert_close(fn(x), fn(x.clone()))  # still fine after the errors
