"""The fusion pass without a GPU: which nodes group, the Triton source, the artifact, the choice.

The kernels themselves run in Triton's interpreter on the CPU where triton is installed
(`fusion_interp`), every config checked against the ATen calls they replace; on a GPU,
`test_fusion_cuda.py` runs them for real.
"""

from __future__ import annotations

import ast
import copy
import math
import re
import warnings
from typing import Any

import pytest
import torch
from fusion_interp import compile_fused, needs_triton, ran_in_fresh_interpreter
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.jit.choice import Choice
from opgen.runtime.artifact.compiled import CompiledGraph
from opgen.runtime.codegen.triton.groups import kernel
from opgen.runtime.codegen.triton.ops import Operand as Op
from opgen.runtime.codegen.triton.ops import common_type, literal, pointwise
from opgen.runtime.errors import OpgenWarning
from opgen.runtime.ir import KernelCall, Program
from opgen.runtime.passes.fusion.groups import find_groups
from opgen.runtime.pipeline import default_pipeline

torch.manual_seed(0)


# ---- models: each fusible pattern ----


class Chain(nn.Module):
    """Pointwise ops with broadcasting, scalars, int -> float promotion, a comparison and where."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        y = (x + bias) * 2.0 - n  # int64 n broadcasts and promotes to float
        y = torch.where(y > 0.5, torch.sigmoid(y), torch.tanh(y) * 0.1)
        return torch.relu(y) + y.exp() / (1.0 + y.abs())


class HalfChain(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = (x * y + 1.0).float()  # half compute, then a cast
        return torch.nn.functional.silu(z).half(), z.sqrt()


class BiasGelu(nn.Module):
    """bias + activation after a matmul: the matmul stays ATen's, add + gelu fuse."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64) / 8)
        self.b = nn.Parameter(torch.randn(64))
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ self.w + self.b, approximate=self.approximate) * 1.5


class PermutedNorm(nn.Module):
    """ConvNeXt's layer norm over channels: of a permuted tensor, alone (ATen copies its input first)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1))


class PermutedCopy(nn.Module):
    """Swin's keys before their product: a copy of a permuted tensor, alone (a generated kernel reads it
    strided; ATen's copy kernel is slower), then a product that stays ATen's."""

    def forward(self, qkv: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return qkv.permute(2, 0, 3, 1, 4).contiguous() @ w


class ResidualNorm(nn.Module):
    """Residual add + layer norm: both results are read afterwards."""

    def __init__(self, width: int = 48) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(h)
        return x + self.norm(x) * 2


class MaskedSoftmax(nn.Module):
    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = scores * 0.125
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, width: int = 40) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + 1e-6) * self.weight


class BufferWrite(nn.Module):
    """A buffer written in place between pointwise ops (export makes the write functional, then copies
    the new value into the buffer at the end: the chain around it fuses, the buffer advances)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = (x + self.state) * 2
        self.state.add_(x)
        return (a + self.state).relu()


class AliasedOutput(nn.Module):
    """An intermediate returned as a view: it is written, the view reads it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = (x * 3).sigmoid()
        return a.t(), (a + 1).relu()


class RowReductions(nn.Module):
    """Sums without keepdim (one value per row), keepdim means read back along the row, amax, log_softmax."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(x) + 1.0
        centered = y - y.mean(-1, keepdim=True)
        return y.sum(-1), centered * 2.0, torch.log_softmax(x * 3.0, dim=-1), (x.abs() * 2).amax(-1)


class OneRow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.5, dim=-1) + 1.0


class RotaryPairs(nn.Module):
    """gpt-fast's rotary embedding: views at a storage offset (the odd elements) read in place."""

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = freqs[..., 0], freqs[..., 1]
        return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2) + x[..., 1:2]


class TypeAsNorm(nn.Module):
    """gpt-fast's RMSNorm after a residual add, in bfloat16: `type_as` casts back with the device named."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(48).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + y
        normed = h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return h, normed.type_as(h) * self.weight


class RotateHalf(nn.Module):
    """transformers' rotary embedding: `cat(-x[..., h:], x[..., :h])`, the products and their sum, one kernel
    (the cat absorbs the neg; the sum merges the two products' groups)."""

    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * sin


class CatMiddle(nn.Module):
    """A cat along a middle dimension of a loaded operand, a computed one and a broadcast one, then an epilogue."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, torch.relu(y) * 2.0, (z + 1.0).expand(2, 3, 5)), dim=1).sigmoid() + 1


class CatOperandReadElsewhere(nn.Module):
    """An operand's group whose value is also returned is not absorbed: it runs, then the cat's kernel."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = (x * 2.0).exp()
        return a, torch.cat((a, y), dim=-1) * 0.5


class NestedCat(nn.Module):
    """A cat of a cat, with an integer operand promoted to float: the inner one is written, the outer reads it."""

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        inner = torch.cat((x * 2.0, n), dim=0)  # int64 n promotes to float
        return torch.cat((inner.exp(), -x), dim=0) + 1.0


class HardActivations(nn.Module):
    """MobileNetV3's activations: hardswish, and hardsigmoid scaling a squeeze-excitation branch (its
    [N, C, 1, 1] chain runs inside the kernel of the product it scales)."""

    def forward(self, x: torch.Tensor, se: torch.Tensor) -> torch.Tensor:
        return F.hardswish(x * 4.0) * F.hardsigmoid(se * 4.0) + 1.0


class WindowMask(nn.Module):
    """A sliding window's mask (Mistral's, Gemma-2's: two comparisons and their `&`), integer bitwise ops, logical
    ones over mixed dtypes, and a where that reads the mask: one kernel."""

    def forward(
        self, scores: torch.Tensor, keys: torch.Tensor, pos: torch.Tensor, n: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        kept = (keys <= pos) & (keys > pos - 4)
        bits = (n & 6) | (n ^ 3)  # int32 with int literals
        odd = torch.logical_xor(n, keys)  # int32 and int64, read as != 0
        masked = torch.where(kept & True, scores, float("-inf")) + bits
        return masked, torch.logical_and(torch.logical_or(kept, bits), odd), (kept ^ odd) | (bits > 2)


def _mask(t: int) -> torch.Tensor:
    return torch.tril(torch.ones(t, t, dtype=torch.bool))


CASES = {  # name -> (model factory, inputs factory)
    "chain": (Chain, lambda: (torch.randn(4, 8, 16), torch.randn(16), torch.randint(-2, 3, (4, 1, 16)))),
    "chain_strided": (Chain, lambda: (torch.randn(16, 8, 4).transpose(0, 2), torch.randn(16), torch.tensor(1))),
    "half_chain": (HalfChain, lambda: (torch.rand(6, 33).half(), torch.rand(6, 33).half())),
    "bias_gelu": (BiasGelu, lambda: (torch.randn(2, 5, 32),)),
    "bias_gelu_tanh": (lambda: BiasGelu("tanh"), lambda: (torch.randn(2, 5, 32),)),
    "residual_norm": (ResidualNorm, lambda: (torch.randn(3, 7, 48), torch.randn(3, 7, 48))),
    "permuted_norm": (PermutedNorm, lambda: (torch.randn(2, 8, 5, 3),)),
    "permuted_copy": (PermutedCopy, lambda: (torch.randn(2, 7, 3, 4, 8), torch.randn(8, 5))),
    "masked_softmax": (MaskedSoftmax, lambda: (torch.randn(2, 3, 9, 9), _mask(9))),
    "rms_norm": (RMSNorm, lambda: (torch.randn(5, 40),)),
    "type_as_norm": (TypeAsNorm, lambda: (torch.randn(3, 7, 48).bfloat16(), torch.randn(3, 7, 48).bfloat16())),
    "buffer_write": (BufferWrite, lambda: (torch.randn(8, 16),)),
    "aliased_output": (AliasedOutput, lambda: (torch.randn(8, 16),)),
    "row_reductions": (RowReductions, lambda: (torch.randn(8, 300),)),
    "one_row": (OneRow, lambda: (torch.randn(1, 37),)),
    "rotary_pairs": (RotaryPairs, lambda: (torch.randn(1, 4, 3, 16), torch.randn(3, 8, 2))),
    "rotate_half": (RotateHalf, lambda: (torch.randn(1, 4, 5, 16), torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16))),
    "rotate_half_bf16": (
        RotateHalf,
        lambda: tuple(t.bfloat16() for t in (torch.randn(2, 3, 5, 8), torch.randn(5, 8), torch.randn(5, 8))),
    ),
    "cat_middle": (CatMiddle, lambda: (torch.randn(2, 4, 5), torch.randn(2, 1, 5), torch.randn(2, 3, 1))),
    "cat_operand_read_elsewhere": (CatOperandReadElsewhere, lambda: (torch.randn(3, 4), torch.randn(3, 2))),
    "hard_activations": (HardActivations, lambda: (torch.randn(2, 8, 5, 5), torch.randn(2, 8, 1, 1))),
    "nested_cat": (NestedCat, lambda: (torch.randn(3, 4), torch.randint(-3, 3, (2, 4)))),
    "window_mask": (
        WindowMask,
        lambda: (
            torch.randn(2, 3, 9),
            torch.arange(9),
            torch.tensor([[[5], [8], [0]], [[3], [6], [1]]]),
            torch.randint(-4, 5, (2, 3, 9), dtype=torch.int32),
        ),
    ),
}
EXPECTED_KERNELS = {  # how many fused kernels each case runs (row kernels take their pointwise neighbours)
    "chain": 1, "chain_strided": 1, "half_chain": 1, "bias_gelu": 1, "bias_gelu_tanh": 1,
    "residual_norm": 1, "permuted_norm": 1, "permuted_copy": 1, "masked_softmax": 1, "rms_norm": 1, "type_as_norm": 1,
    "buffer_write": 2, "aliased_output": 2,
    "row_reductions": 3, "one_row": 1, "rotary_pairs": 2, "rotate_half": 1, "rotate_half_bf16": 1, "cat_middle": 1,
    "cat_operand_read_elsewhere": 2, "hard_activations": 1, "nested_cat": 2, "window_mask": 1,
}  # fmt: skip
# Half precision: intermediate values stay in float32 (as Inductor keeps them), so results are a rounding
# of the half-precision intermediate apart (bfloat16: 2^-8 relative).
TOLERANCE = {
    "half_chain": {"atol": 2e-3, "rtol": 2e-3},
    "type_as_norm": {"atol": 2e-2, "rtol": 2e-2},
    "rotate_half_bf16": {"atol": 2e-2, "rtol": 2e-2},
}
# buffer_write: the buffer is written in place (passes.reinplace), a write no kernel spans: a kernel
# before it and one after.


@needs_triton
@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_kernels_match_eager(
    name: str, backend: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if ran_in_fresh_interpreter(request):
        return
    make_model, make_inputs = CASES[name]
    model, inputs = make_model(), make_inputs()
    eager = copy.deepcopy(model)
    tolerance = TOLERANCE.get(name, {"atol": 1e-5, "rtol": 1e-5})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)  # backend="cpp" runs the C++ executor, or the test fails
        compiled, ran = compile_fused(monkeypatch, model, inputs, tolerance, backend=backend)
        expected, got = eager(*inputs), compiled(*inputs)
    assert len(ran) == EXPECTED_KERNELS[name], compiled.report()
    for g, e in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, expected)), strict=True):
        torch.testing.assert_close(g, e, equal_nan=True, **tolerance)


@needs_triton
def test_buffer_write_runs_between_the_kernels(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model = BufferWrite()
    x = torch.randn(8, 16)
    with torch.no_grad():
        compiled, _ = compile_fused(monkeypatch, model, (x,))
        eager = BufferWrite()
        for _ in range(3):  # the buffer advances each call, in both
            torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(model.state, eager.state)


# ---- without triton: decisions, source, artifact, choice ----


def _fused_program(monkeypatch: pytest.MonkeyPatch, name: str) -> Program:
    """The program the fusion pass leaves for a case (the kernels bound to their ATen calls)."""
    import fusion_interp as interp

    captured: list[Program] = []
    original = interp.fuse_as_if_cuda

    def spy(program: Program, registry: object) -> Program:
        captured.append(original(program, registry))  # type: ignore[arg-type]
        return captured[-1]

    monkeypatch.setattr(interp, "fuse_as_if_cuda", spy)
    make_model, make_inputs = CASES[name]
    model, inputs = make_model(), make_inputs()
    eager = copy.deepcopy(model)
    with torch.no_grad():
        compiled, _ = compile_fused(monkeypatch, model, inputs, run_triton=False)
        expected, got = eager(*inputs), compiled(*inputs)  # the ATen side of each choice, as generated
    for g, e in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, expected)), strict=True):
        torch.testing.assert_close(g, e)
    assert len(captured) == 1 and captured[0].fused, "no group was fused"
    return captured[0]


def test_groups_and_source_read_like_hand_written_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _fused_program(monkeypatch, "masked_softmax").fused[0]
    assert "row kernel" in spec.describe
    tree = ast.parse(spec.source)  # valid Python, one @triton.jit function
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in functions] == [spec.name]
    assert "# aten._softmax.default" in spec.source and spec.name.startswith("fused_")
    assert "_softmax" not in spec.source.split("# aten._softmax")[0].split("@triton.jit")[1]  # no node names
    assert "tl.max(" in spec.source and "tl.sum(" in spec.source
    assert [n for n in spec.nodes][-1].startswith("_softmax")
    for meta, warps, stages, grid in spec.configs:  # grids cover the rows
        block_r = dict(meta)["BLOCK_R"]
        assert grid[0] * block_r >= 2 * 3 * 9 and warps >= 1 and stages >= 1


def test_artifact_round_trips_the_fused_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    import opgen.runtime.pipeline as pipeline

    captured: list[CompiledGraph] = []
    original = pipeline.compiled_graph

    def spy(*args: object, **kwargs: object) -> CompiledGraph:
        captured.append(original(*args, **kwargs))  # type: ignore[arg-type]
        return captured[-1]

    monkeypatch.setattr(pipeline, "compiled_graph", spy)
    program = _fused_program(monkeypatch, "residual_norm")
    (graph,) = captured
    assert graph.fused and all(f.lines == () for f in graph.fused)
    assert [f.lines != () for f in program.fused] == [True] * len(program.fused)
    again = CompiledGraph.from_json(graph.to_json())
    assert again.fused == graph.fused
    assert "def fused0_aten(" in graph.source and 'rt.jit["fused0"](fused0_aten)' in graph.source


def _same_as_eager_twice(name: str, compiled: Any, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    eager = copy.deepcopy(model)
    for _ in range(2):  # stateful cases (buffer_write) advance in both
        expected, got = eager(*inputs), compiled(*inputs)
        for g, e in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, expected)), strict=True):
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cpp_executor_calls_each_fused_kernel_as_python_does(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """backend="cpp": the program calls each fused kernel's binding (here its ATen calls) as an extern,
    and carries its two alternatives (the Triton launch, the ATen calls) for once it is settled."""
    make_model, make_inputs = CASES[name]
    model, inputs = make_model(), make_inputs()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)
        compiled, _ = compile_fused(monkeypatch, copy.deepcopy(model), inputs, run_triton=False, backend="cpp")
        _same_as_eager_twice(name, compiled, model, inputs)
    assert type(compiled).__name__ == "CppFunction"
    assert compiled.picks == {}  # the test binds its own functions (no FusedBinding): they stay calls
    program = compiled.artifact.cpp_program
    count = EXPECTED_KERNELS[name]
    assert len(re.findall(r"^  [^#]+ = call fused\d+ ", program, re.M)) == count
    assert len(re.findall(r"^  _ = call fused\d+\.launcher ", program, re.M)) == count
    assert len(re.findall(r"^alternative fused\d+ (triton|aten)$", program, re.M)) == 2 * count


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cpp_executor_runs_the_picked_side_in_place_of_the_call(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the runtime's own bindings and no Triton kernel to load here, each choice settles on its ATen
    calls; after the first call the executor runs them inline (`picks`), with the same results."""
    from fusion_interp import fuse_as_if_cuda

    import opgen.runtime.passes as passes

    monkeypatch.setitem(passes.PASSES, "fusion_on_cpu", lambda p, r: fuse_as_if_cuda(p, r))
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "aten")
    pipeline = [p for p in default_pipeline() if p != "fusion"]
    pipeline.insert(pipeline.index("memo"), "fusion_on_cpu")
    make_model, make_inputs = CASES[name]
    model, inputs = make_model(), make_inputs()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", OpgenWarning)
        warnings.filterwarnings("ignore", "opgen: fused kernel .* cannot be loaded", OpgenWarning)  # no triton here
        compiled = opgen.compile(copy.deepcopy(model), inputs, passes=pipeline, cache=False, backend="cpp")
        assert type(compiled).__name__ == "CppFunction" and compiled.picks is None
        _same_as_eager_twice(name, compiled, model, inputs)
    assert compiled.picks == {f"fused{k}": "aten" for k in range(EXPECTED_KERNELS[name])}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_fuses_and_its_aten_side_matches(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    program = _fused_program(monkeypatch, name)
    assert len(program.fused) == EXPECTED_KERNELS[name]
    for fused in program.fused:
        ast.parse(fused.source)
        alone = name in ("permuted_norm", "permuted_copy")  # lone nodes that read a strided input in place
        assert fused.name in fused.source and len(fused.nodes) >= (1 if alone else 2)


def test_a_lone_copy_is_a_kernel_where_it_reads_a_permuted_tensor(registry: object) -> None:
    """A copy of a permuted tensor is worth a kernel of its own (Swin's q, k and v); of a broadcast (stride 0:
    a grouped-query attention's repeated heads) or of a dense tensor it is not: ATen's copy is as fast."""
    from opgen.runtime.ir import Input, Ref, Return, TensorMeta, Value, contiguous_strides

    shape = (2, 3, 5, 8)
    dense = TensorMeta(shape, contiguous_strides(shape), "float32", "cuda:0")
    sources = {
        "permuted": TensorMeta(shape, (120, 8, 24, 1), "float32", "cuda:0"),
        "broadcast": TensorMeta(shape, (40, 0, 8, 1), "float32", "cuda:0"),
        "dense": dense,
    }
    found = {}
    for name, source in sources.items():
        body = (KernelCall("clone", (Ref("x"),), (), (Value("y", dense),), "clone", "aten.clone.default"),)
        program = Program("forward", (Input("x", source),), (), (), (*body, Return((Ref("y"),))))
        found[name] = [(f.alone, f.strided) for f in find_groups(program, registry)]  # type: ignore[arg-type]
    assert found == {"permuted": [(True, True)], "broadcast": [], "dense": []}


def test_nothing_reads_attention_output_by_its_recorded_strides(registry: object) -> None:
    """ATen picks attention's output layout when it runs (flash, memory-efficient and cuDNN attention
    return [B, L, H, D] storage; the graph recorded the math path's contiguous [B, H, L, D]), so the copy
    of its transpose (ViT's, BART's) stays an ATen call, as does anything else reading it or its views.
    The same copy of a permuted input still is a kernel of its own."""
    from opgen.runtime.ir import Input, Ref, Return, TensorMeta, Value, View, contiguous_strides

    shape = (1, 4, 65, 32)
    dense = TensorMeta(shape, contiguous_strides(shape), "float32", "cuda:0")
    moved = TensorMeta((1, 65, 4, 32), (8320, 32, 2080, 1), "float32", "cuda:0")
    out = TensorMeta((1, 65, 4, 32), contiguous_strides((1, 65, 4, 32)), "float32", "cuda:0")
    sdpa = "aten.scaled_dot_product_attention.default"
    found = {}
    producers = {"attention": (sdpa, "scaled_dot_product_attention"), "other": ("aten.mul.Tensor", "mul")}
    for producer, (target, kernel_name) in producers.items():
        made = KernelCall(kernel_name, (Ref("q"), Ref("q")), (), (Value("a", dense),), "a", target)
        body = (
            made,
            View(Value("t", moved), "a", "transpose"),
            KernelCall("clone", (Ref("t"),), (), (Value("y", out),), "clone", "aten.clone.default"),
            KernelCall("mul", (Ref("y"), 2.0), (), (Value("z", out),), "mul_1", "aten.mul.Tensor"),
            Return((Ref("z"),)),
        )
        program = Program("forward", (Input("q", dense),), (), (), body)
        found[producer] = [f.group.nodes for f in find_groups(program, registry)]  # type: ignore[arg-type]
    assert found == {"attention": [], "other": [("clone", "mul_1")]}


def test_nothing_fuses_on_the_cpu_or_alone() -> None:
    """The real pass leaves CPU programs alone (here through opgen.compile on the CPU)."""
    import opgen

    make_model, make_inputs = CASES["chain"]
    model = make_model()
    passes = [*(p for p in ("identity_views", "dead_code")), "fusion"]
    with torch.no_grad():
        compiled = opgen.compile(model, make_inputs(), passes=passes, cache=False)
    assert "fused" not in str(compiled.report())


def test_groups_close_at_writes_and_outside_readers(registry: object) -> None:
    """Hand-built: a reader between two chain members closes the group; an in-place call closes all."""
    from opgen.runtime.ir import Input, Ref, Return, TensorMeta, Value, contiguous_strides

    def meta(*shape: int) -> TensorMeta:
        return TensorMeta(shape, contiguous_strides(shape), "float32", "cuda:0")

    def call(kernel: str, target: str, *args: object, out: str) -> KernelCall:
        return KernelCall(kernel, tuple(args), (), (Value(out, meta(4, 4)),), out, target)

    body = (
        call("relu", "aten.relu.default", Ref("x"), out="a"),
        call("sigmoid", "aten.sigmoid.default", Ref("a"), out="b"),
        call("mm", "aten.mm.default", Ref("a"), Ref("x"), out="m"),  # reads a: closes {a, b}
        call("exp", "aten.exp.default", Ref("b"), out="c"),
        call("neg", "aten.neg.default", Ref("c"), out="d"),
        KernelCall("add_", (Ref("m"), Ref("x")), (), (), "w", "aten.add_.Tensor", mutates=("m",)),
        call("neg", "aten.neg.default", Ref("d"), out="e"),
        call("tanh", "aten.tanh.default", Ref("e"), out="f"),
        Return((Ref("f"), Ref("m"))),
    )
    program = Program("forward", (Input("x", meta(4, 4)),), (), (), body)
    groups = [[s.node for s in f.group.steps] for f in find_groups(program, registry)]  # type: ignore[arg-type]
    assert groups == [["a", "b"], ["c", "d"], ["e", "f"]]
    first = find_groups(program, registry)[0].group  # type: ignore[arg-type]
    assert [t.name for t in first.outputs] == ["a", "b"]  # a is read by mm, b by exp
    assert math.prod(first.shape) == 16


def test_a_layout_copy_a_pass_made_fuses_with_what_reads_it(registry: object) -> None:
    """The cuDNN region's copy back to contiguous (target: why it is there) joins the activation after it."""
    from opgen.runtime.ir import Input, Ref, Return, Sym, TensorMeta, Value, contiguous_strides

    shape = (1, 8, 4, 4)
    channels_last = TensorMeta(shape, (128, 1, 32, 8), "float32", "cuda:0")
    dense = TensorMeta(shape, contiguous_strides(shape), "float32", "cuda:0")
    contiguous = (("memory_format", Sym("memory_format", "contiguous_format")),)
    why = "contiguous copy out of the channels-last region"
    body = (
        KernelCall("clone", (Ref("x"),), contiguous, (Value("a", dense),), "conv", why),
        KernelCall("hardswish", (Ref("a"),), (), (Value("b", dense),), "hardswish", "aten.hardswish.default"),
        Return((Ref("b"),)),
    )
    program = Program("forward", (Input("x", channels_last),), (), (), body)
    (found,) = find_groups(program, registry)  # type: ignore[arg-type]
    assert [s.target for s in found.group.steps] == ["aten.clone.default", "aten.hardswish.default"]
    source = kernel(found.group).source
    assert "tl.load(in0 + " in source and "tl.store(out0 + offs" in source  # read channels-last, write dense


class OddPower(nn.Module):
    """A pointwise chain through pow with an exponent the Triton backend has no expression for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).abs().pow(2.7) + 1


def test_a_group_the_backend_cannot_write_stays_aten_with_a_comment_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = torch.rand(4, 8)
    with torch.no_grad():
        compiled, ran = compile_fused(monkeypatch, OddPower(), (x,), run_triton=False)
        torch.testing.assert_close(compiled(x), OddPower()(x))
    source = compiled.artifact.source
    assert ran == [] and "fused0" not in source
    note = "# not fused (mul, abs_1, pow_1, add): node 'pow_1' (aten.pow.Tensor_Scalar): no Triton expression"
    assert note in source and source.index(note) < source.index("mul_scalar(x, 2)")  # above the group


def test_expressions_promote_like_aten() -> None:
    i64, f32, b = Op("n", "int64"), Op("x", "float32"), Op("m", "bool")
    assert common_type(i64, 2.5) == "float32" and common_type(f32, 3) == "float32" and common_type(b, 1) == "int64"
    assert (
        pointwise("aten.add.Tensor", {"self": i64, "other": f32, "alpha": 2}, "float32") == "n.to(tl.float32) + 2.0 * x"
    )
    assert pointwise("aten.gt.Scalar", {"self": i64, "other": 0.5}, "bool") == "n.to(tl.float32) > 0.5"
    assert pointwise("aten.div.Tensor_mode", {"self": i64, "other": i64, "rounding_mode": "floor"}, "int64") is None
    assert pointwise("aten.pow.Tensor_Scalar", {"self": f32, "exponent": 2.7}, "float32") is None
    assert literal(float("-inf"), "float32") == 'float("-inf")' and literal(0.5, "int64") is None
    i32 = Op("k", "int32")
    assert pointwise("aten.bitwise_and.Tensor", {"self": b, "other": b}, "bool") == "m & m"
    assert pointwise("aten.bitwise_or.Tensor", {"self": i32, "other": b}, "int32") == "k | m.to(tl.int32)"
    assert pointwise("aten.bitwise_xor.Scalar", {"self": i64, "other": 3}, "int64") == "n ^ 3"
    assert pointwise("aten.bitwise_and.Scalar", {"self": i64, "other": 0.5}, "int64") is None  # ATen refuses it too
    assert pointwise("aten.logical_or.default", {"self": f32, "other": i64}, "bool") == "((x != 0)) | ((n != 0))"


def test_a_failing_candidate_falls_back_to_the_reliable_one_with_a_warning() -> None:
    calls: list[str] = []

    def broken(x: torch.Tensor) -> torch.Tensor:
        calls.append("broken")
        raise RuntimeError("Triton could not compile fused0")

    def aten(x: torch.Tensor) -> torch.Tensor:
        calls.append("aten")
        return x + 1

    choice = Choice("fused0 (test)", {"triton": broken, "aten": aten}, reliable="aten", force="triton")
    x = torch.zeros(3)
    with pytest.warns(OpgenWarning, match="candidate 'triton' failed .*running 'aten' instead"):
        torch.testing.assert_close(choice(x), x + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: later calls go straight to the reliable candidate
        torch.testing.assert_close(choice(x), x + 1)
    assert calls == ["broken", "aten", "aten"]
    assert "failed" in choice.describe()


def test_kernel_source_for_a_hand_built_group() -> None:
    from opgen.runtime.ir import FusedGroup, Ref, Step, Tensor, TensorMeta

    x = Tensor("x", TensorMeta((2, 3), (1, 2), "float16", "cuda:0"))  # column-major input
    out = Tensor("y", TensorMeta((2, 3), (3, 1), "float16", "cuda:0"))
    mid = Tensor("t", TensorMeta((2, 3), (3, 1), "float32", "cuda:0"))
    steps = (
        Step("t", "aten._to_copy.default", (("self", Ref("x")), ("dtype", None)), (mid,)),
        Step("y", "aten.relu.default", (("self", Ref("t")),), (out,)),
    )
    generated = kernel(FusedGroup("pointwise", (2, 3), (x,), (out,), steps))
    source = generated.source
    assert f"def {generated.name}(in0, out0, BLOCK: tl.constexpr):" in source  # no graph names: layers share it
    assert "tl.load(in0 + offs // 3 + (offs % 3) * 2, mask=mask).to(tl.float32)" in source  # column-major
    assert "v2 = " not in source.split("# aten.relu.default")[0]  # the cast to float32 is the load's own
    assert "tl.store(out0 + offs, " in source and ".to(tl.float16)" in source
    a, u, b = Tensor("a", x.meta), Tensor("u", mid.meta), Tensor("b", out.meta)  # another layer's values
    steps = (
        Step("u", "aten._to_copy.default", (("self", Ref("a")), ("dtype", None)), (u,)),
        Step("b", "aten.relu.default", (("self", Ref("u")),), (b,)),
    )
    assert kernel(FusedGroup("pointwise", (2, 3), (a,), (b,), steps)) == generated  # one kernel for both
