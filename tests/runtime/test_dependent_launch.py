"""The dependent-launch pass: where the device facts allow it, every generated kernel is marked to launch
dependently, and its printed source waits for the one before it at its top (or, a matrix-vector
kernel, after reading its first weights); elsewhere nothing changes. On a GPU of compute capability 9.0 or newer, the
fusion, gemv, attention and cache-write GPU tests run every kernel that way; here the end-to-end
test checks results and the marks."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import torch
from test_gemv import Block, compile_gemv

import opgen
from opgen.runtime import passes
from opgen.runtime.codegen.triton import few_rows
from opgen.runtime.codegen.triton import gemv as gemv_triton
from opgen.runtime.codegen.triton.dependent_launch import SIGNAL, WAIT
from opgen.runtime.codegen.triton.kernels import print_kernels
from opgen.runtime.codegen.triton.module import jit_module
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel, Program, TensorMeta, Value
from opgen.runtime.passes.dependent_launch import launch_dependently
from opgen.runtime.passes.fusion.gemv import fuse_gemv
from opgen.runtime.pipeline import default_pipeline, default_registry
from opgen.runtime.registry import DeviceFacts


def registry(dependent: bool):  # type: ignore[no-untyped-def]
    return dataclasses.replace(default_registry(), facts=DeviceFacts(dependent_launch=dependent))


def pointwise() -> FusedKernel:
    name, source = jit_module(
        "fused", ["in0", "out0"], "XBLOCK: tl.constexpr", "    # a kernel\n    pid = tl.program_id(0)"
    )
    meta = TensorMeta((4,), (1,), "float32", "cuda:0")
    spec = FusedKernel.make("fused0", None, inputs=(("a", "float32"),), outputs=(Value("b", meta),), nodes=("n",),
                            describe="pointwise")  # fmt: skip
    return spec.printed(name, source, ())


def test_each_kernel_waits_at_its_top_where_the_device_allows() -> None:
    program = Program("forward", (), (), (), (), fused=(pointwise(),))
    assert launch_dependently(program, registry(False)) is program  # no facts, no change
    (spec,) = print_kernels(launch_dependently(program, registry(True))).fused
    assert spec.dependent_launch and spec.name == pointwise().name
    body = spec.source.split(f"def {spec.name}(in0, out0, XBLOCK: tl.constexpr):\n")[1].splitlines()
    assert body[0].strip().startswith(SIGNAL) and body[1].strip().startswith(WAIT) and body[2] == "    # a kernel"
    ast.parse(spec.source)
    (again,) = print_kernels(launch_dependently(dataclasses.replace(program, fused=(spec,)), registry(True))).fused
    assert again == spec  # once


def test_a_matrix_vector_kernel_reads_its_weights_before_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, _ = compile_gemv(monkeypatch, Block(), (torch.randn(1, 64),))
    program = compiled.artifact  # type: ignore[attr-defined]
    facts = default_registry().facts.dependent_launch  # this machine's: on for a Hopper GPU, off for none
    assert program.fused and all((WAIT in s.source) == facts for s in program.fused)
    helpers = (gemv_triton._ROWS, gemv_triton._GATED, few_rows._TILES, few_rows._GATED)  # one row; a few rows
    for helper in helpers:
        source = gemv_triton.dependent_helper(helper, True)
        loads = [source.index(f"tl.load({w}") for w in ("w", "wg", "wu") if f"tl.load({w} " in source]
        assert max(loads) < source.index(WAIT) < source.index("tl.load(x")
        assert source.index(SIGNAL) < min(loads)
        assert WAIT not in gemv_triton.dependent_helper(helper, False)


def test_the_gemv_pass_writes_the_wait_where_the_facts_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the facts on, each matrix-vector kernel waits once, after its first weights; the dependent
    launch pass then only marks it. (Kernels bound to their ATen side: this machine runs no gdc.)"""
    from opgen.runtime.passes.relabel import relabel

    specs: list[FusedKernel] = []

    def gemv_dependent(program: Program, _: object) -> Program:
        on = registry(True)
        out = print_kernels(relabel(launch_dependently(fuse_gemv(relabel(program, "cuda:0"), on), on), "cpu"))
        specs.extend(out.fused)
        return out

    monkeypatch.setitem(passes.PASSES, "gemv_dependent", gemv_dependent)
    monkeypatch.setattr(fused_module, "bindings", lambda found: {s.local: (lambda aten: aten) for s in found})
    pipeline = [p for p in default_pipeline() if p not in ("gemv", "fusion", "mkl_linear", "prepack", "onednn")]
    pipeline.insert(pipeline.index("memo"), "gemv_dependent")
    model, x = Block().eval(), torch.randn(1, 64)
    with torch.no_grad():
        compiled = opgen.compile(model, (x,), passes=pipeline, cache=False)
        torch.testing.assert_close(compiled(x), model(x))
    assert len(specs) == 4 and all(s.dependent_launch and s.source.count(WAIT) == 1 for s in specs)
    assert all(s.source.index("tl.load(w") < s.source.index(WAIT) for s in specs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_every_generated_kernel_launches_dependently_and_matches() -> None:
    if not default_registry().facts.dependent_launch:
        pytest.skip("this GPU (or triton) has no programmatic dependent launch")
    model = Block(d=256, kv=128, hidden=704).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
        for graphs in (False, True):
            compiled = opgen.compile(model, (x,), cuda_graphs=graphs, cache=False)
            fused = compiled.artifact.fused  # type: ignore[attr-defined]
            assert fused and all(s.dependent_launch and WAIT in s.source for s in fused)
            for _ in range(3):
                x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
                torch.testing.assert_close(compiled(x).clone(), model(x), atol=2e-2, rtol=2e-2)
