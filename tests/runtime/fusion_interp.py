"""Running the fusion pass's kernels without a GPU: Triton's interpreter (TRITON_INTERPRET=1) on CPU.

`compile_fused(model, inputs)` compiles on the CPU with a pass that relabels the program's values
as CUDA, runs the fusion pass, and relabels them back; each fused kernel is then bound to
`InterpretedBinding`, which runs the generated Triton source in Triton's interpreter with every one
of its configs, checks each against the ATen calls it replaces, and returns the Triton results.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import opgen
from opgen.runtime.codegen.triton.kernels import print_kernels
from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.passes import DEFAULT_PIPELINE, run_passes
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.passes.relabel import relabel
from opgen.runtime.pipeline import default_pipeline
from opgen.runtime.registry import KernelRegistry

# Triton's interpreter must be on before triton is first imported: on a GPU machine the CUDA tests
# import it first, and run the same kernels for real (test_fusion_cuda.py).
# oneDNN's and MKL's passes: left out where a CPU program stands in for a CUDA one (linear layers stay `addmm`)
CPU_PASSES = ("onednn", "mkl_linear", "prepack")

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)


def ran_in_fresh_interpreter(request: pytest.FixtureRequest) -> bool:
    """Triton reads TRITON_INTERPRET when it is first imported: where an earlier test imported it for
    real, run this test again in a child process with the interpreter on from the start, and say so
    (True: the child ran it, and passed)."""
    if "triton.language" not in sys.modules:
        return False  # compile_fused turns the interpreter on before the first import
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(sys.modules["triton.language"].sigmoid, InterpretedFunction):
        return False  # triton.language was made for the interpreter: its @jit helpers run there
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
        cwd=request.config.rootpath,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    return True


def run_passes_as_if_cuda(program: Program, registry: KernelRegistry,
                          names: Sequence[str] = DEFAULT_PIPELINE) -> Program:  # fmt: skip
    """`run_passes` as on CUDA (the GPU passes too), the result back on the CPU: monkeypatched over
    `opgen.runtime.pipeline.run_passes`, `opgen.compile(..., passes=DEFAULT_PIPELINE)` plans a GPU step."""
    return relabel(run_passes(relabel(program, "cuda:0"), registry, names), "cpu")


def fuse_as_if_cuda(program: Program, registry: KernelRegistry) -> Program:
    """The fusion pass as if on CUDA, its kernels printed (as the pipeline prints them after the passes)."""
    return print_kernels(relabel(fuse(relabel(program, "cuda:0"), registry), "cpu"))


def _layout(t: torch.Tensor) -> tuple[int, ...]:
    """The strides that place elements: a dimension of one element has none (any stride is the same layout)."""
    return tuple(st for n, st in zip(t.shape, t.stride(), strict=True) if n != 1)


class InterpretedBinding:
    """Runs every config of the kernel in Triton's interpreter (or, with CUDA inputs and the interpreter off,
    on the GPU) and checks it against the ATen calls."""

    def __init__(self, spec: FusedKernel, checks: list[str], tolerance: dict[str, float]) -> None:
        from opgen.runtime.execution.fused import load_function

        self.spec = spec
        self.fn = load_function(spec, prefix="opgen_interpreted")  # not the GPU's JITFunction of it
        self.checks = checks
        self.tolerance = tolerance

    def __call__(self, aten: Callable[..., Any]) -> Callable[..., Any]:
        spec = self.spec
        if spec.writes and not spec.outputs:
            return self._writing(aten)
        # A kernel with outputs that writes inputs too writes its working memory (a split attention kernel's
        # partials and counters): every config runs on the real buffers, one after the other, so a config
        # that leaves them unfit for the next launch fails the next one.

        def run(*inputs: torch.Tensor) -> Any:
            expected = aten(*inputs)
            expected = expected if isinstance(expected, tuple) else (expected,)
            outs: Sequence[torch.Tensor] = ()
            device = inputs[0].device  # the CPU in the interpreter; a GPU where the tests launch every config there
            for meta, warps, _, grid in spec.configs:
                outs = [torch.empty_strided(v.meta.shape, v.meta.stride, dtype=getattr(torch, v.meta.dtype),  # type: ignore[union-attr]
                                            device=device) for v in spec.outputs]  # fmt: skip
                self.fn[grid](*inputs, *outs, **dict(meta), num_warps=warps)
                for got, want in zip(outs, expected, strict=True):
                    assert _layout(got) == _layout(want) or got.numel() <= 1, (spec.name, got.stride(), want.stride())
                    torch.testing.assert_close(got, want, equal_nan=True, **self.tolerance)
            self.checks.append(spec.name)
            return outs[0] if len(outs) == 1 else tuple(outs)

        return run

    def _writing(self, aten: Callable[..., Any]) -> Callable[..., Any]:
        """A kernel that writes its inputs in place: each config writes copies of them, compared with
        what the ATen calls write into other copies; then the ATen calls write the real ones."""
        spec = self.spec
        at = spec.written_inputs

        def copies(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            return [t.clone() if i in at else t for i, t in enumerate(inputs)]

        def run(*inputs: torch.Tensor) -> None:
            want = copies(inputs)
            aten(*want)
            for meta, warps, _, grid in spec.configs:
                got = copies(inputs)
                self.fn[grid](*got, **dict(meta), num_warps=warps)
                for i in at:
                    torch.testing.assert_close(got[i], want[i], rtol=0, atol=0)
            aten(*inputs)
            self.checks.append(spec.name)

        return run


def compile_fused(
    monkeypatch: pytest.MonkeyPatch,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    tolerance: dict[str, float] | None = None,
    run_triton: bool = True,
    backend: str = "python",
) -> tuple[Any, list[str]]:
    """(compiled function, names of the fused kernels it ran: filled in as it runs).

    Without `run_triton` each fused kernel is bound to its ATen calls alone (no triton needed).
    `backend`: opgen.compile's (the C++ executor calls each fused kernel's binding as an extern).
    """
    from opgen.runtime import passes
    from opgen.runtime.execution import fused as fused_module

    checks: list[str] = []
    tol = tolerance or {}
    monkeypatch.setitem(passes.PASSES, "fusion_on_cpu", lambda p, r: fuse_as_if_cuda(p, r))
    if run_triton:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(
            fused_module, "bindings", lambda specs: {s.local: InterpretedBinding(s, checks, tol) for s in specs}
        )
    else:
        monkeypatch.setattr(fused_module, "bindings", lambda specs: {s.local: (lambda aten: aten) for s in specs})
    pipeline = [p for p in default_pipeline() if p != "fusion"]
    pipeline.insert(pipeline.index("memo"), "fusion_on_cpu")
    compiled = opgen.compile(model, inputs, passes=pipeline, cache=False, backend=backend)
    return compiled, checks


def compile_with_pass(
    monkeypatch: pytest.MonkeyPatch,
    model: torch.nn.Module,
    example: tuple[Any, ...],
    gpu_pass: str,
    run: Callable[[Program, KernelRegistry], Program],
    checks: list[str] | None = None,
    tolerance: dict[str, float] | None = None,
    before: str = "memo",
    leave_out: tuple[str, ...] = (),
) -> tuple[Any, list[FusedKernel]]:
    """(compiled function, its kernels): `model` compiled with `run` (one of the passes that make Triton
    kernels, `gpu_pass` by name) as if on CUDA, at that pass's place in the default pipeline (other
    GPU passes and those named in `leave_out` left out). Kernels are bound to their ATen side, or
    with `checks`, run in Triton's interpreter with every config and checked against it
    (`InterpretedBinding`). Where the default pipeline lacks the pass (no GPU), it goes before the
    pass named `before`."""
    from opgen.runtime import passes
    from opgen.runtime.execution import fused as fused_module

    specs: list[FusedKernel] = []

    def on_cpu(program: Program, registry: KernelRegistry) -> Program:
        out = print_kernels(relabel(run(relabel(program, "cuda:0"), registry), "cpu"))  # the kernels' sources
        specs.extend(out.fused)
        return out

    monkeypatch.setitem(passes.PASSES, f"{gpu_pass}_on_cpu", on_cpu)
    if checks is not None:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        tol = tolerance or {}
        monkeypatch.setattr(
            fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tol) for s in found}
        )
    else:
        monkeypatch.setattr(fused_module, "bindings", lambda found: {s.local: (lambda aten: aten) for s in found})
    pipeline = [p for p in default_pipeline() if p not in ("gemv", "fusion", *leave_out) or p == gpu_pass]
    pipeline = [f"{gpu_pass}_on_cpu" if p == gpu_pass else p for p in pipeline]
    if f"{gpu_pass}_on_cpu" not in pipeline:  # a pipeline without a GPU leaves the pass out: put it `before`
        pipeline.insert(pipeline.index(before), f"{gpu_pass}_on_cpu")
    with torch.no_grad():
        return opgen.compile(model.eval(), example, passes=pipeline, cache=False), specs


def compile_as_on_cuda(
    monkeypatch: pytest.MonkeyPatch,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    checks: list[str] | None = None,
) -> tuple[Any, list[FusedKernel]]:
    """`model` compiled with the GPU passes before fusion (split_bias, casts, lift_views) and fusion itself as
    if on CUDA, oneDNN's passes left out so that linear layers stay `addmm` as on CUDA (`compile_with_pass`)."""
    from opgen.runtime.passes.fusion.bias import split_bias
    from opgen.runtime.passes.fusion.casts import move_casts
    from opgen.runtime.passes.fusion.lift_views import lift_views

    def passes(program: Program, registry: KernelRegistry) -> Program:
        return fuse(lift_views(move_casts(split_bias(program, registry), registry), registry), registry)

    return compile_with_pass(monkeypatch, model.eval(), inputs, "fusion", passes, checks, leave_out=CPU_PASSES)


def cpu_programs_unchanged(model: torch.nn.Module, inputs: tuple[Any, ...], gpu_pass: str) -> None:
    """A GPU pass (by name) leaves a CPU program as it was: the same source with it and without it."""
    passes = [p for p in default_pipeline() if p not in CPU_PASSES]
    with torch.no_grad():
        plain = opgen.compile(model, inputs, passes=[p for p in passes if p != gpu_pass], cache=False)
        moved = opgen.compile(model, inputs, passes=[*passes, gpu_pass], cache=False)
    a, b = plain.artifact, moved.artifact  # type: ignore[attr-defined]
    assert a.source.replace(a.key[:16], "") == b.source.replace(b.key[:16], "")
