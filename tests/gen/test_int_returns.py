"""`int`/`SymInt` results beside tensors in a tuple return (fused attention's `SymInt max_q`).

The spec accepts them only in a tuple that also returns a Tensor; the stub types them `int`, the
registry records their type, and the binding wraps the kernel's tuple as it is (C++ `opgen::wrap`
turns a `c10::SymInt` or `int64_t` into a Python int).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opgen.gen.bindings import emit_function
from opgen.gen.registry import registry
from opgen.gen.stub import py_return
from opgen.spec.loader import SpecError
from opgen.spec.model import OpSpec
from opgen.spec.validate import load_spec

FLASH = (
    "_scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value, float dropout_p=0.0, "
    "bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> (Tensor output, "
    "Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor rng_state, "
    "Tensor unused, Tensor debug_attn_mask)"
)
FLASH_ENTRY = f"- func: {FLASH}\n  kernels: {{cuda: at::cuda::_scaled_dot_product_flash_attention}}\n"


def load(tmp_path: Path, text: str) -> tuple[OpSpec, ...]:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path, display_name="ops.yaml")


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load(tmp_path, text)
    return info.value.problems


def test_symint_results_beside_tensors(tmp_path: Path) -> None:
    (op,) = load(tmp_path, FLASH_ENTRY)
    assert [str(r.type) for r in op.schema.returns][3:6] == ["Tensor", "SymInt", "SymInt"]
    assert py_return(op) == "tuple[Tensor, Tensor, Tensor, Tensor, int, int, Tensor, Tensor, Tensor]"
    (info,) = registry((op,))
    assert info["returns_tuple"] and info["backends"] == ["cuda"]
    assert [(r["name"], r["type"]) for r in info["returns"]][:5] == [
        ("output", "Tensor"),
        ("logsumexp", "Tensor"),
        ("cum_seq_q", "Tensor"),
        ("cum_seq_k", "Tensor"),
        ("max_q", "SymInt"),
    ]
    code = emit_function(op)
    assert "return opgen::wrap(at::cuda::_scaled_dot_product_flash_attention(" in code
    assert code.index("#ifdef OPGEN_WITH_CUDA") < code.index("at::cuda::") < code.index("#endif")
    assert "devices.no_kernel();" in code  # CPU tensors: NotImplementedError, in every build


BESIDE = "(allowed: Tensor, Tensor[]; int and SymInt beside a Tensor)"


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        ("int", "return type 'int' is not supported (allowed: Tensor, Tensor[])"),
        ("(int a, SymInt b)", f"return type 'int' is not supported {BESIDE}"),
        ("(Tensor a, int? b)", f"return type 'int?' is not supported {BESIDE}"),
        ("(Tensor a, int[] b)", f"return type 'int[]' is not supported {BESIDE}"),
    ],
)
def test_other_int_returns_are_refused(tmp_path: Path, returns: str, message: str) -> None:
    found = problems(tmp_path, f"- func: f(Tensor self) -> {returns}\n  kernels: {{cpu: at::cpu::f}}\n")
    assert f"ops.yaml:1: op 'f': {message}" in found


def test_triton_op_returns_tensors_only(tmp_path: Path) -> None:
    text = (
        "- func: tadd(Tensor self) -> (Tensor out, SymInt n)\n"
        "  triton:\n"
        "    kernel: pkg.kernels:add_kernel\n"
        "    args: {x_ptr: self, out_ptr: out, n: numel(self)}\n"
        "    outputs: {out: empty_like(self), n: empty_like(self)}\n"
        "    grid: ['cdiv(n, BLOCK)']\n"
        "    configs: [{BLOCK: 1024}]\n"
    )
    assert any("a Triton op returns tensors only, not 'SymInt'" in p for p in problems(tmp_path, text))
