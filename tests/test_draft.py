"""`python -m opgen.draft`: spec entries drafted from the torch.library ops a process registers validate as a spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opgen import draft
from opgen.spec.validate import load_spec

NS = "opgen_draft_test"
_lib = torch.library.Library(NS, "DEF")
_lib.define("two(Tensor x, int n=2) -> (Tensor, Tensor)")
_lib.define("two.out(Tensor x, int n=2, *, Tensor(a!) out) -> Tensor(a!)")
_lib.define("names(Tensor x, str[] d) -> Tensor")


@torch.library.custom_op(f"{NS}::scaled_add", mutates_args=())
def scaled_add(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return a + alpha * b


def test_every_overload_is_drafted_and_the_draft_is_a_valid_spec(tmp_path: Path) -> None:
    text = draft.draft([NS])
    assert "- func: scaled_add(Tensor a, Tensor b, float alpha=1.) -> Tensor\n" in text
    assert f"  kernels: {{cpu: {NS}::scaled_add}}" in text
    assert f"  includes: [{NS}/scaled_add.h]" in text
    for op in ("scaled_add", "two", "two.out"):
        assert f"  torch_op: {NS}::{op}\n" in text
    (tmp_path / "draft.yaml").write_text(text)
    ops = load_spec(tmp_path / "draft.yaml")
    assert sorted(op.schema.qualified_name for op in ops) == ["scaled_add", "two", "two.out"]
    paths = {op.torch_op.path for op in ops if op.torch_op}
    assert paths == {f"{NS}.scaled_add.default", f"{NS}.two.default", f"{NS}.two.out"}


def test_an_op_the_spec_cannot_bind_is_drafted_commented_out_under_the_reason() -> None:
    text = draft.draft([NS])
    reason = "# not bindable yet: op 'names': arg 'd': lists of 'str' are not supported"
    assert f"{reason}" in text
    assert f"# - func: names(Tensor x, str[] d) -> Tensor\n#   kernels: {{cpu: {NS}::names}}" in text


def test_a_namespace_without_ops_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="no ops registered under nobody_here in this process"):
        draft.draft(["nobody_here"])


def test_the_command_imports_the_registering_module_and_writes_the_file(tmp_path: Path) -> None:
    (tmp_path / "registers_ops.py").write_text(
        "import torch\nlib = torch.library.Library('opgen_draft_cmd', 'DEF')\nlib.define('twice(Tensor x) -> Tensor')\n"
    )
    out = tmp_path / "spec.yaml"
    command = [sys.executable, "-m", "opgen.draft", "--import", "registers_ops", "opgen_draft_cmd", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    assert "- func: twice(Tensor x) -> Tensor\n" in out.read_text()
    assert [op.torch_op.path for op in load_spec(out) if op.torch_op] == ["opgen_draft_cmd.twice.default"]
