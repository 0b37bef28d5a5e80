"""Every case of runtime_cases.py matches eager through opgen.compile and torch.compile(backend="opgen")."""

from __future__ import annotations

import copy

import pytest
import torch
from runtime_cases import CASES, GraphCase
from torch.utils import _pytree as pytree

import opgen
from opgen.runtime.passes import DEFAULT_PIPELINE
from opgen.runtime.pipeline import default_pipeline


def assert_same(out: object, ref: object, atol: float) -> None:
    out_leaves, out_spec = pytree.tree_flatten(out)
    ref_leaves, ref_spec = pytree.tree_flatten(ref)
    assert out_spec == ref_spec, f"output structure {out_spec} != eager's {ref_spec}"
    for got, want in zip(out_leaves, ref_leaves, strict=True):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)


def run_twice(case: GraphCase, compile_fn) -> None:
    """Compile on copies, call twice (persistent buffers must not leak into results), compare to eager."""
    model, inputs = case.model(), case.inputs()
    eager_model = copy.deepcopy(model)
    with torch.no_grad():
        compiled = compile_fn(model, tuple(i.clone() for i in inputs))
        results, eager_results = [], []
        for _ in range(2):
            args = tuple(i.clone() for i in inputs)
            eager_args = tuple(i.clone() for i in inputs)
            results.append((compiled(*args), args))
            eager_results.append((eager_model(*eager_args), eager_args))
        for (out, args), (ref, eager_args) in zip(results, eager_results, strict=True):
            assert_same(out, ref, case.atol)
            if case.mutates:  # writes to inputs and buffers happen as in eager
                assert_same(args, eager_args, case.atol)
                assert_same(list(model.buffers()), list(eager_model.buffers()), case.atol)


BACKENDS = ["python", "cpp"]  # codegen backends: the generated Python, the C++ executor (codegen.cpp)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_opgen_compile_matches_eager(case: GraphCase, backend: str) -> None:
    run_twice(case, lambda model, inputs: opgen.compile(model, inputs, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_torch_compile_backend_matches_eager(case: GraphCase, backend: str) -> None:
    torch._dynamo.reset()
    options = {"backend": backend}
    run_twice(case, lambda model, inputs: torch.compile(model, backend="opgen", dynamic=False, options=options))


def test_at_least_fifteen_graphs() -> None:
    assert len(CASES) >= 15


def test_results_are_fresh_tensors_the_caller_owns() -> None:
    """Graph outputs never live in persistent buffers: a later call leaves earlier results alone. (Without
    the `mkl_linear` pass, whose product has no out= variant, the hidden layer's result is a buffer.)"""
    model = CASES[[c.name for c in CASES].index("mlp")].model()
    passes = [p for p in default_pipeline() if p != "mkl_linear"]
    with torch.no_grad():
        compiled = opgen.compile(model, (torch.randn(4, 32),), passes=passes)
        first = compiled(torch.randn(4, 32))
        kept = first.clone()
        second = compiled(torch.randn(4, 32))
    assert "empty_strided" in compiled.artifact.source  # the graph does use persistent buffers
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, kept)


OPTIONAL_PASS_CASES = [c for c in CASES if c.name in ("gpt_block", "conv_bn_pool", "reshape_add")]


@pytest.mark.parametrize("skipped", ["(none)", *dict.fromkeys(DEFAULT_PIPELINE), "(all)"])
def test_every_pass_is_optional(skipped: str) -> None:
    """The same graphs stay correct with any one pass left out, and with no passes at all."""
    passes = () if skipped == "(all)" else tuple(p for p in DEFAULT_PIPELINE if p != skipped)
    for case in OPTIONAL_PASS_CASES:
        run_twice(case, lambda model, inputs: opgen.compile(model, inputs, passes=passes, cache=False))


def test_plain_functions_compile_too() -> None:
    x, y = torch.randn(3, 4), torch.randn(4)
    with torch.no_grad():
        compiled = opgen.compile(lambda a, b: torch.tanh(a) * b, (x, y))
    torch.testing.assert_close(compiled(x, y), torch.tanh(x) * y)
