"""The matrix-vector pass without a GPU: which products group, the Triton source, the ATen side.

The programs are relabelled as CUDA around the pass (as `fusion_interp` does for the fusion pass),
and each kernel is bound to the ATen calls it replaced, so the results check that the pass kept
the graph's meaning; `test_gemv_cuda.py` runs the Triton kernels themselves on a GPU.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from fusion_interp import InterpretedBinding, needs_triton, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime import passes
from opgen.runtime.codegen.triton.kernels import print_kernels
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import (
    FusedKernel,
    Input,
    KernelCall,
    Program,
    Ref,
    Return,
    TensorConstant,
    TensorMeta,
    Value,
    contiguous_strides,
)
from opgen.runtime.passes.fusion.gemv import find_siblings, fuse_gemv
from opgen.runtime.passes.relabel import relabel
from opgen.runtime.pipeline import default_pipeline
from opgen.runtime.registry import KernelRegistry

torch.manual_seed(0)


class Block(nn.Module):
    """The products of a decoder layer: q/k/v over one input, o alone, gate/up over one input, down alone."""

    def __init__(self, d: int = 64, kv: int = 32, hidden: int = 96, bias: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d, bias=bias), nn.Linear(d, kv, bias=bias), nn.Linear(d, kv, bias=bias)
        self.o = nn.Linear(d, d, bias=bias)
        self.gate, self.up = nn.Linear(d, hidden, bias=bias), nn.Linear(d, hidden, bias=bias)
        self.down = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        y = x + self.o(q * torch.cat([k, v], dim=-1))
        return y + self.down(nn.functional.silu(self.gate(y)) * self.up(y))


def compile_gemv(
    monkeypatch: pytest.MonkeyPatch,
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    checks: list[str] | None = None,
    before: tuple[Callable[[Program, KernelRegistry], Program], ...] = (),
    made: list[Program] | None = None,
) -> tuple[object, list[FusedKernel]]:
    """Compiled with the pass (as if on CUDA) in place of the GPU passes; kernels bound to their ATen
    side, or with `checks`, run in Triton's interpreter with every config and checked against it. The passes
    `before` run first, as if on CUDA too (the programs they make go to `made`)."""
    specs: list[FusedKernel] = []

    def gemv_on_cpu(program: Program, registry: KernelRegistry) -> Program:
        program = relabel(program, "cuda:0")
        for run in before:
            program = run(program, registry)
        if made is not None:
            made.append(program)
        out = print_kernels(relabel(fuse_gemv(program, registry), "cpu"))  # with their sources
        specs.extend(out.fused)
        return out

    monkeypatch.setitem(passes.PASSES, "gemv_on_cpu", gemv_on_cpu)
    if checks is None:
        monkeypatch.setattr(fused_module, "bindings", lambda found: {s.local: (lambda aten: aten) for s in found})
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        tolerance = {"atol": 1e-4, "rtol": 1e-4}
        monkeypatch.setattr(
            fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
        )
    gpu = ("transpose_weights", "split_products", "gemv", "fusion", "mkl_linear", "prepack", "onednn")
    pipeline = [p for p in default_pipeline() if p not in gpu]
    pipeline.insert(pipeline.index("memo"), "gemv_on_cpu")
    with torch.no_grad():
        return opgen.compile(model.eval(), inputs, passes=pipeline, cache=False), specs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rank", [2, 3])
def test_siblings_share_one_kernel_and_the_aten_side_matches_eager(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, bias: bool, rank: int
) -> None:
    model = Block(bias=bias).to(dtype)
    x = torch.randn(*([1] * (rank - 1)), 64, dtype=dtype)
    compiled, specs = compile_gemv(monkeypatch, model, (x,))
    rows = sorted(s.describe.split(": ")[1] for s in specs)
    mlp = "96 + 96 rows" if bias else "96 rows"  # silu(gate) * up in one kernel where the products have no bias
    assert rows == sorted(["64 + 32 + 32 rows", "64 rows", "64 rows", mlp]), [s.describe for s in specs]
    assert any("silu(gate) * up" in s.describe for s in specs) != bias
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]
    source = compiled.artifact.source  # type: ignore[attr-defined]
    assert 'rt.jit["gemv0"](gemv0_aten)' in source


def test_kernel_source_and_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_gemv(monkeypatch, Block(), (torch.randn(1, 64),))
    qkv = next(s for s in specs if len(s.outputs) == 3)
    tree = ast.parse(qkv.source)
    names = [f.name for f in tree.body if isinstance(f, ast.FunctionDef)]
    assert names == ["_rows", qkv.name]
    assert qkv.source.count("_rows(") == 4 and "elif pid < " in qkv.source and "else:" in qkv.source
    assert "def gemv_" in qkv.source and "(x, w0, w1, w2, out0, out1, out2, BLOCK_N" in qkv.source
    assert len(qkv.nodes) == 3  # the nodes are the report's to name, not the shared source's
    for meta, _, _, grid in qkv.configs:  # the grid covers every product's rows
        block_n, block_k = dict(meta)["BLOCK_N"], dict(meta)["BLOCK_K"]
        assert grid == (sum(-(-n // block_n) for n in (64, 32, 32)),)
        assert block_k <= 64
    assert all(isinstance(line, KernelCall) and line.target == "aten.mm.default" for line in qkv.lines)
    assert len({line.args[0] for line in qkv.lines}) == 1  # the ATen side reads the one input the kernel reads


def test_a_gated_pair_writes_silu_gate_times_up_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_gemv(monkeypatch, Block(), (torch.randn(1, 64),))
    (mlp,) = (s for s in specs if "silu(gate) * up" in s.describe)
    assert (
        "def gemv_" in mlp.source
        and "(x, w0, w1, out0, BLOCK_N" in mlp.source
        and "_gated(x, w0, w1, out0" in mlp.source
    )
    assert [line.target for line in mlp.lines][-2:] == ["aten.silu.default", "aten.mul.Tensor"]
    gate = {mlp.lines[0].outputs[0].name}  # type: ignore[union-attr]  # w0's product: what silu reads, through views
    for line in mlp.lines[2:-2]:
        if line.args[0] in [Ref(n) for n in gate]:
            gate.add(line.outputs[0].name)  # type: ignore[union-attr]
    assert mlp.lines[-2].args[0] in [Ref(n) for n in gate]
    assert len(mlp.outputs) == 1 and mlp.outputs[0].meta.shape == (1, 96)  # type: ignore[union-attr]
    assert all(grid == (-(-96 // dict(meta)["BLOCK_N"]),) for meta, _, _, grid in mlp.configs)  # a program does both


class GeGLU(nn.Module):
    """Gemma's MLP: gelu (tanh-approximated, or exact) of the gate times up, then down."""

    def __init__(self, approximate: str, d: int = 64, hidden: int = 96) -> None:
        super().__init__()
        self.approximate = approximate
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.gate(x), approximate=self.approximate) * self.up(x))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_a_gelu_gated_pair_is_one_kernel_too(monkeypatch: pytest.MonkeyPatch, approximate: str) -> None:
    model, x = GeGLU(approximate), torch.randn(1, 64)
    compiled, specs = compile_gemv(monkeypatch, model, (x,))
    name = "gelu_tanh" if approximate == "tanh" else "gelu"
    (mlp,) = (s for s in specs if f"{name}(gate) * up" in s.describe)
    assert [line.target for line in mlp.lines][-2:] == ["aten.gelu.default", "aten.mul.Tensor"]
    assert ("tl.erf(" in mlp.source) == (approximate == "none") and "tl.sigmoid(g)" not in mlp.source
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]


@needs_triton
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("rows", [1, 8])
def test_the_gelu_gated_kernels_match_in_the_interpreter(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, approximate: str, rows: int
) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model, checks = GeGLU(approximate, d=80, hidden=70), []
    compiled, specs = compile_gemv(monkeypatch, model, (torch.randn(rows, 80),), checks=checks)
    x = torch.randn(rows, 80)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert any("gelu" in s.describe for s in specs) and sorted(checks) == sorted(s.name for s in specs)


class GateReadTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.gate(x)
        return nn.functional.silu(g) * self.up(x), g


def test_a_gate_read_elsewhere_keeps_its_products(monkeypatch: pytest.MonkeyPatch) -> None:
    model = GateReadTwice()
    compiled, specs = compile_gemv(monkeypatch, model, (torch.randn(1, 64),))
    assert [s.describe.split(": ")[1] for s in specs] == ["96 + 96 rows"]
    x = torch.randn(1, 64)
    with torch.no_grad():
        for got, want in zip(compiled(x), model(x), strict=True):  # type: ignore[operator]
            torch.testing.assert_close(got, want)


def test_layers_share_one_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two identical layers: one source per kind of product, so each compiles (and tunes) once."""
    model = nn.Sequential(Block(), Block())
    _, specs = compile_gemv(monkeypatch, model, (torch.randn(1, 64),))
    assert len(specs) == 8 and len({s.source for s in specs}) == 4  # qkv, o, gate/up, down
    assert len({s.name for s in specs}) == 4


def test_nothing_changes_on_the_cpu_or_past_64_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_gemv(monkeypatch, Block(), (torch.randn(65, 64),))
    assert specs == []  # 65 rows: a matrix product, cuBLAS's
    with torch.no_grad():
        plain = opgen.compile(Block().eval(), (torch.randn(1, 64),), passes=("gemv",), cache=False)
    assert plain.artifact.fused == ()  # type: ignore[attr-defined]  # CPU values: untouched


class WeightAsInput(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w.t()


def test_a_weight_that_is_not_a_constant_stays_with_aten(monkeypatch: pytest.MonkeyPatch) -> None:
    _, specs = compile_gemv(monkeypatch, WeightAsInput(), (torch.randn(1, 64), torch.randn(32, 64)))
    assert specs == []


def test_a_write_between_siblings_splits_them() -> None:
    """q and k read x, and a call writes x between them: they cannot share a kernel (hand-built IR)."""

    def meta(*shape: int, stride: tuple[int, ...] | None = None) -> TensorMeta:
        return TensorMeta(shape, stride or contiguous_strides(shape), "bfloat16", "cuda:0")

    def mm(x: str, w: str, out: str) -> KernelCall:
        return KernelCall("mm", (Ref(x), Ref(w)), (), (Value(out, meta(1, 16)),), out, "aten.mm.default")

    def transpose(w: str) -> KernelCall:
        out = Value(f"{w}_t", meta(16, 16, stride=(1, 16)))
        return KernelCall("permute", (Ref(w), (1, 0)), (), (out,), "t", "aten.permute.default")

    setup = (transpose("wq"), transpose("wk"))
    write = KernelCall("add_", (Ref("x"), 1.0), (), (), "bump", "aten.add_.Scalar", mutates=("x",))
    body = (mm("x", "wq_t", "q"), write, mm("x", "wk_t", "k"), Return((Ref("q"), Ref("k"))))
    constants = tuple(TensorConstant(w, w, meta(16, 16)) for w in ("wq", "wk"))
    program = Program("forward", (Input("x", meta(1, 16)),), constants, setup, body)
    assert [len(s.products) for s in find_siblings(program)] == [1, 1]
    together = replace(program, body=(body[0], body[2], write, body[3]))
    assert [len(s.products) for s in find_siblings(together)] == [2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(8, 64), (5, 1, 64), (64, 64)])
def test_few_rows_take_tensor_core_tiles_and_the_aten_side_matches_eager(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, bias: bool, shape: tuple[int, ...]
) -> None:
    """Batched decode: 2 to 64 rows group as one row does, into kernels of tensor-core tiles."""
    model = Block(bias=bias).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    compiled, specs = compile_gemv(monkeypatch, model, (x,))
    rows = shape[0]
    assert all(s.describe.startswith("few-row kernel, ") and f" of {rows} rows of " in s.describe for s in specs)
    widths = sorted(s.describe.split(": ")[1] for s in specs)
    assert widths == sorted(["64 + 32 + 32 rows", "64 rows", "64 rows", "96 + 96 rows" if bias else "96 rows"])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # type: ignore[operator]
    block_m = max(16, 1 << (rows - 1).bit_length())
    for spec in specs:
        helper = "_gated" if "silu(gate) * up" in spec.describe else "_tiles"
        assert "def gemm_rows_" in spec.source and f"{helper}(x, w0, " in spec.source and "tl.dot(xs, " in spec.source
        assert f", {block_m}, BLOCK_N, BLOCK_K)" in spec.source  # the tile's rows: a power of two, at least 16
        assert 'input_precision="ieee"' in spec.source  # float32 inputs at full precision, not TF32
        n = int(spec.describe.split(": ")[1].split(" ")[0])
        for meta, _, stages, grid in spec.configs:
            block_n, block_k = dict(meta)["BLOCK_N"], dict(meta)["BLOCK_K"]
            assert block_n >= 16 and 16 <= block_k <= 128 and stages >= 2  # K: 64 or 96
            if helper == "_gated":
                assert grid == (-(-n // block_n),)  # a program does both products


def test_a_deep_pipeline_of_many_rows_fits_in_shared_memory() -> None:
    """64 rows of a gated pair: the tiles that would overflow shared memory take fewer stages, then less K."""
    from opgen.runtime.codegen.triton import few_rows
    from opgen.runtime.ir import GemvPlan, GemvRows

    rows = (GemvRows(8192, 2048, False), GemvRows(8192, 2048, False))
    plan = GemvPlan(2048, 1, rows, gated=True, m=64, x_row_stride=2048)
    for meta, _, stages, _ in few_rows.configs(plan):
        block_n, block_k = dict(meta)["BLOCK_N"], dict(meta)["BLOCK_K"]
        assert stages * (64 + 2 * block_n) * block_k * 4 <= few_rows.SHARED_BYTES
        assert stages >= 2 and block_k >= 16


@needs_triton
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 8])
def test_the_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                              bias: bool, rows: int) -> None:  # fmt: skip
    """Every kernel of a layer (the gated pair's where there is no bias), every tile, against its ATen calls."""
    if ran_in_fresh_interpreter(request):
        return
    model = Block(d=80, kv=40, hidden=70, bias=bias)  # sizes that not every tile divides
    checks: list[str] = []
    compiled, specs = compile_gemv(monkeypatch, model, (torch.randn(rows, 80),), checks=checks)
    x = torch.randn(rows, 80)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)  # type: ignore[operator]
    assert sorted(checks) == sorted(s.name for s in specs) and len(specs) == 4
