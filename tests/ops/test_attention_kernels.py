"""The fused CUDA attention kernels (`_scaled_dot_product_{flash,efficient,cudnn}_attention`).

torch.compile's graphs call them by name (AOT autograd expands `scaled_dot_product_attention` into
the kernel `_fused_sdp_choice` picks), so a strict compile on the GPU needs each bound. Their values
against eager are checked by test_ops_cuda.py with the samples of samples_core.py; here: what the
registry says of them, that a CPU tensor is a clear error in every build, that the capture keeps them
whole, that the lowering calls them (a graph of fake CUDA tensors, on any machine), and on a GPU that
the kernel eager picks for decode shapes is bound, strict compiles through both entry points match
eager, and inputs the kernels do not take raise Python exceptions (never crash the process).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend

import opgen
from opgen import kernel_ops
from opgen.runtime.capture.decompositions import KEEP_FUSED, kept_ops
from opgen.runtime.frontend import dynamo as dynamo_backend
from opgen.runtime.ir.signature import GraphSignature, OutputSpec, PlaceholderSpec
from opgen.runtime.pipeline import CompileOptions, compile_graph, default_pipeline, default_registry
from opgen.spec.schema import parse_schema

aten = torch.ops.aten
INFO = kernel_ops.get_kernel_ops_args_info()
OPS = {
    SDPBackend.FLASH_ATTENTION: "_scaled_dot_product_flash_attention",
    SDPBackend.EFFICIENT_ATTENTION: "_scaled_dot_product_efficient_attention",
    SDPBackend.CUDNN_ATTENTION: "_scaled_dot_product_cudnn_attention",
}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _overload(name: str) -> torch._ops.OpOverload:
    return getattr(aten, name).default


@pytest.mark.parametrize("name", OPS.values())
def test_registry_describes_the_kernel(name: str) -> None:
    """CUDA only; the results are torch's, in order and type (the runtime reads only `output`)."""
    info = INFO[name]
    assert info["backends"] == ["cuda"] and info["kernels"] == {"cuda": f"at::cuda::{name}"}
    assert info["aten"] == f"aten::{name}" and info["variant"] == "functional" and info["returns_tuple"]
    assert info["out"] is None and info["inplace"] is None and not info["is_view"] and not info["mutates"]
    schema = parse_schema(str(_overload(name)._schema).removeprefix("aten::"))  # SymInt as torch writes it
    assert [(r["name"], r["type"]) for r in info["returns"]] == [(r.name, str(r.type)) for r in schema.returns]
    assert info["returns"][0] == {"name": "output", "type": "Tensor"}
    assert [(a["name"], a["type"]) for a in info["args"]] == [(a.name, str(a.type)) for a in schema.args]


@pytest.mark.parametrize("name", OPS.values())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpu_tensors_are_refused(name: str, dtype: torch.dtype) -> None:
    """In a CPU build and a CUDA one alike: a NotImplementedError naming the op, as ATen (no crash)."""
    q = torch.randn(1, 2, 4, 16, dtype=dtype)
    args = (q, q, q) if name.endswith("flash_attention") else (q, q, q, None, False)
    with pytest.raises(NotImplementedError, match=rf"^kernel_ops\.{name}\(\): has no kernel for device type 'cpu'"):
        getattr(kernel_ops, name)(*args)
    with pytest.raises(NotImplementedError):
        _overload(name)(*args)


def test_capture_keeps_them_whole() -> None:
    kept = kept_ops(default_registry())
    for name in OPS.values():
        assert _overload(name) in KEEP_FUSED and _overload(name) in kept


def _fused_graph(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor]:
    """What AOT autograd makes of a layer's attention: a fused kernel, then its first result."""
    a = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, True)[0]
    b = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, scale=0.25)[0]
    c = aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]
    return (a + b + c,)


def test_lowering_calls_the_bound_kernels() -> None:
    """A graph of fake CUDA tensors (no GPU needed) lowers strictly: each kernel is called directly and
    only its output is kept (the SymInt results too are unpacked into `_`)."""
    with FakeTensorMode():
        q, k, v = (torch.empty(1, 4, 5, 16, dtype=torch.float16, device="cuda") for _ in range(3))
        bias = torch.empty(1, 4, 5, 5, dtype=torch.float16, device="cuda")
        gm = make_fx(_fused_graph, tracing_mode="fake")(q, k, v, bias)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    signature = GraphSignature(tuple(PlaceholderSpec(n, "input") for n in names), (OutputSpec("user"),), "tuple")
    graph, _ = compile_graph(gm, signature, CompileOptions(False, default_pipeline(), False), "attention")
    assert graph.fallback_nodes == ()
    q, k, v, bias = names
    calls = [line.strip().split("  #")[0] for line in graph.source.splitlines() if "_attention(" in line]
    assert calls[:3] == [
        f"buf0, _, _, _, _, _, _, _, _ = _scaled_dot_product_cudnn_attention({q}, {k}, {v}, {bias}, False, 0.0, True)",
        f"buf4, _, _, _, _, _, _, _, _ = _scaled_dot_product_flash_attention({q}, {k}, {v}, 0.0, True, scale=0.25)",
        f"buf9, _, _, _ = _scaled_dot_product_efficient_attention({q}, {k}, {v}, {bias}, False)",
    ], graph.source


# --- on a GPU: decode shapes, the kernel eager picks, strict compiles -------------------------------------
class Attend(nn.Module):
    """A layer's attention as Hugging Face's SDPA path calls it: `enable_gqa` without a mask, else
    key/value heads repeated (`repeat_kv`) when there are fewer of them."""

    def __init__(self, enable_gqa: bool, is_causal: bool) -> None:
        super().__init__()
        self.enable_gqa, self.is_causal = enable_gqa, is_causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        groups = q.shape[1] // k.shape[1]
        if groups > 1 and not self.enable_gqa:
            k, v = (_repeat_kv(t, groups) for t in (k, v))
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.is_causal, enable_gqa=self.enable_gqa
        )


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    b, h, s, d = t.shape
    return t[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


# (id, query heads, key/value heads, query length, key length, mask, enable_gqa, is_causal)
CASES = [
    ("decode", 32, 32, 1, 37, None, False, False),
    ("decode_float_mask", 32, 32, 1, 37, "float", False, False),
    ("decode_bool_mask", 32, 32, 1, 37, "bool", False, False),
    ("decode_gqa", 32, 8, 1, 37, None, True, False),
    ("decode_repeated_kv_mask", 32, 8, 1, 37, "float", False, False),
    ("prefill_causal", 32, 32, 16, 16, None, False, True),
    ("prefill_gqa_causal", 32, 8, 16, 16, None, True, True),
    ("prefill_float_mask", 32, 32, 16, 16, "float", False, False),
]


def _inputs(case: tuple[Any, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    _, hq, hkv, sq, sk, mask, _, _ = case
    q = torch.randn(1, sq, hq, 64, device="cuda", dtype=dtype).transpose(1, 2)  # [B, S, H, D] projections
    k, v = (torch.randn(1, sk, hkv, 64, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(2))
    if mask is None:
        return q, k, v
    keep = torch.ones(1, 1, sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq)
    keep[..., 1] = False  # a padded position (every row keeps key 0: none is wholly masked)
    if mask == "bool":
        return q, k, v, keep
    return q, k, v, torch.zeros(keep.shape, dtype=dtype, device="cuda").masked_fill(~keep, torch.finfo(dtype).min)


def _graph_targets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ATen overloads of every graph the torch.compile backend compiles from now on."""
    seen: list[str] = []
    original = dynamo_backend.compile_aten_graph

    def recording(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return original(gm, *args, **kwargs)

    monkeypatch.setattr(dynamo_backend, "compile_aten_graph", recording)
    return seen


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_strict_compiles_match_eager(
    case: tuple[Any, ...], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel eager picks is bound, and both entry points compile the layer strictly and match eager."""
    inputs = _inputs(case, dtype)
    model = Attend(enable_gqa=case[6], is_causal=case[7])
    q, k, v, *mask = inputs
    if not case[6] and q.shape[1] != k.shape[1]:
        k, v = _repeat_kv(k, q.shape[1] // k.shape[1]), _repeat_kv(v, q.shape[1] // v.shape[1])
    choice = SDPBackend(torch._fused_sdp_choice(q, k, v, *mask, is_causal=case[7], enable_gqa=case[6]))
    print(f"{case[0]} {dtype}: eager picks {choice.name}")
    assert choice in (*OPS, SDPBackend.MATH), choice
    if choice in OPS:
        assert "cuda" in INFO[OPS[choice]]["backends"]
    # One query row over a cache runs opgen's decode-attention kernel, not eager's (float32 softmax and
    # sums in another order: a unit in the last place apart); every other case binds eager's own kernel.
    tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float16 else {"atol": 2e-2, "rtol": 2e-2}
    tol = tol if case[0].startswith("decode") else {}
    with torch.no_grad():
        expected = model(*inputs)
        compiled = opgen.compile(model, inputs, cache=False)
        assert compiled.report().fallbacks == ()
        torch.testing.assert_close(compiled(*inputs), expected, **tol)
        torch._dynamo.reset()
        seen = _graph_targets(monkeypatch)
        dynamo = torch.compile(model, backend="opgen", dynamic=False, options={"cache": False})
        torch.testing.assert_close(dynamo(*inputs), expected, **tol)
    if choice in OPS:
        assert f"aten.{OPS[choice]}.default" in seen, seen


BAD_INPUTS_SCRIPT = """
import torch
from opgen import kernel_ops

def t(*shape, dtype=torch.float16, device="cuda"):
    return torch.randn(*shape, dtype=dtype, device=device)

q = t(1, 2, 5, 16)
BAD = {
    "3-d query": (t(2, 5, 16), q, q, None),
    "head_dim differs": (q, t(1, 2, 5, 8), t(1, 2, 5, 8), None),
    "heads do not divide": (t(1, 3, 5, 16), q, q, None),
    "batch differs": (q, t(2, 2, 5, 16), t(2, 2, 5, 16), None),
    "key and value lengths differ": (q, q, t(1, 2, 6, 16), None),
    "dtypes differ": (q, t(1, 2, 5, 16, dtype=torch.float32), q, None),
    "head_dim 512": (t(1, 2, 5, 512), t(1, 2, 5, 512), t(1, 2, 5, 512), None),
    "bias of another shape": (q, q, q, t(1, 2, 5, 7)),
    "bias on the CPU": (q, q, q, t(1, 2, 5, 5, device="cpu")),
}
for name in OPS:
    for what, (a, b, c, bias) in BAD.items():
        if name.endswith("flash_attention") and bias is not None:
            continue
        args = (a, b, c) if name.endswith("flash_attention") else (a, b, c, bias, False)
        try:
            out = getattr(kernel_ops, name)(*args)
            torch.cuda.synchronize()
            if what == "head_dim 512":  # a kernel that takes it must compute it right
                ref = torch.ops.aten._scaled_dot_product_attention_math(a.float(), b.float(), c.float())[0]
                if torch.allclose(out[0].float(), ref, atol=2e-2, rtol=2e-2):
                    print(f"matched math {name}: {what}", flush=True)
                    continue
            print(f"returned {name}: {what}", flush=True)
        except Exception as e:
            print(f"raised {type(e).__name__} {name}: {what}: {str(e).splitlines()[0][:200]}", flush=True)
torch.cuda.synchronize()
print("healthy", float(kernel_ops.add(q, q).sum()), flush=True)
"""


@needs_cuda
def test_bad_inputs_raise_cleanly() -> None:
    """Shapes the fused kernels do not take: a Python exception, never a crash or a CUDA error (run in a
    child process, so that a crash fails the test instead of killing pytest). Lists what each did."""
    script = f"OPS = {list(OPS.values())!r}\n{BAD_INPUTS_SCRIPT}"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    print(done.stdout)
    assert done.returncode == 0, f"the process died (exit code {done.returncode}): {done.stdout}{done.stderr[-2000:]}"
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("healthy"), done.stdout
    bad = [
        line
        for line in lines[:-1]
        if not line.startswith(
            ("raised RuntimeError", "raised ValueError", "raised TypeError", "raised IndexError", "matched math")
        )
    ]
    assert not bad, "\n".join(bad)
    assert not [line for line in lines if "CUDA error" in line or "illegal" in line], done.stdout
