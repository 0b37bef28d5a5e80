"""Setup folding for packages (opgen/runtime/artifact/setup_folding.py): constant-only setup calls become
constants, on hand-written programs and on a packaged CNN whose batch-norm folding no longer runs at load."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import opgen
from opgen import _C
from opgen.runtime.artifact.setup_folding import fold
from opgen.runtime.execution.guards import PROCEED

PROGRAM = """program f registers 3 statics 6
input r0 x float32 cpu [4] [1]
constant s0 w
constant s1 b
setup:
  s2 = mul.cpu s0 s0  # w * w
  s3 = add.cpu s2 s1  # + b
  s4 = view.cpu s0 [2,2]  # a view of w: stays a setup line
  s5 = empty_strided [4] [1] torch.float32 device(cpu)
body:
  r1 = mul.cpu r0 s3  # x * (w * w + b)
  r2 = add.cpu r1 s4  # no: shapes differ; only the text matters here
  return single r1
"""


def values(program: str, constants: list[torch.Tensor]) -> list[object]:
    return _C.setup_values(program, constants)


def shares(a: object, b: object) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def test_constant_only_calls_become_constants_and_what_only_they_read_goes() -> None:
    w, b = torch.arange(4.0), torch.ones(4)
    folded = fold(PROGRAM, values(PROGRAM, [w, b]), lambda v: isinstance(v, torch.Tensor), shares)
    keys = [key for key, _ in folded.constants]
    assert keys == ["w", "setup.s3"]  # b and s2 were read only by folded lines
    torch.testing.assert_close(folded.constants[1][1], w * w + b)
    lines = folded.program.splitlines()
    assert "program f registers 3 statics 4" in lines
    assert "constant s0 w" in lines and "constant s1 setup.s3" in lines
    setup = lines[lines.index("setup:") + 1 : lines.index("body:")]
    assert setup == ["  s2 = view.cpu s0 [2,2]  # a view of w: stays a setup line",
                     "  s3 = empty_strided [4] [1] torch.float32 device(cpu)"]  # fmt: skip
    assert "  r1 = mul.cpu r0 s1  # x * (w * w + b)" in lines and lines[-2].startswith("  r2 = add.cpu r1 s2  # no:")


def test_a_folded_program_binds_and_computes_the_same() -> None:
    program = PROGRAM.replace("  r2 = add.cpu r1 s4  # no: shapes differ; only the text matters here\n", "")
    w, b = torch.randn(4), torch.randn(4)
    folded = fold(program, values(program, [w, b]), lambda v: isinstance(v, torch.Tensor), shares)
    before = _C.cpp_function(program, [w, b], {}, None, PROCEED, None)
    after = _C.cpp_function(folded.program, [v for _, v in folded.constants], {}, None, PROCEED, None)
    x = torch.randn(4)
    torch.testing.assert_close(after(x), before(x))


def test_nothing_folds_where_setup_writes_in_place_or_values_cannot_be_stored() -> None:
    in_place = PROGRAM.replace("  s4 = view.cpu s0 [2,2]", "  add_.cpu s2 s1")
    vals = values(PROGRAM, [torch.arange(4.0), torch.ones(4)])
    assert fold(in_place, vals, lambda v: True, shares).program == in_place
    unstorable = fold(PROGRAM, vals, lambda v: False, shares)
    assert [k for k, _ in unstorable.constants] == ["w", "b"]


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)).relu()


def test_a_package_holds_the_folded_weights(tmp_path: Path) -> None:
    model, x = ConvBN().eval(), torch.randn(2, 3, 16, 16)
    path = opgen.package(model, (x,), tmp_path / "convbn.opgen")
    contents = _C.read_package(str(path))
    setup = contents["program"].split("setup:")[1].split("body:")[0]
    assert "rsqrt" not in setup and "mul.cpu" not in setup, setup  # batch norm was folded when written
    assert not any(k.startswith("bn.") for k in contents["constant_keys"])
    torch.testing.assert_close(opgen.load_package(path)(x), model(x).detach(), rtol=1e-4, atol=1e-4)
