"""The `attention_writes` pass: a step's cache-write kernel taken into the decode attention that reads the
cache after it (one launch instead of two), its ATen side, and the kernels in Triton's interpreter.

On the CPU the program is relabelled as CUDA around the passes (`decode_attention`, `cache_writes`, then
this one), as in the decode-attention tests; kernels are bound to their ATen side, or, where triton is
installed and there is no GPU, run in Triton's interpreter with every config and checked against it.
"""

from __future__ import annotations

import pytest
import torch
from fusion_interp import compile_with_pass, ran_in_fresh_interpreter, run_passes_as_if_cuda
from test_decode_attention import CacheAttention, cuda, inputs, interpreter, one_row_kernels, run_steps
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.runtime import pipeline
from opgen.runtime.ir import FusedKernel, Program
from opgen.runtime.passes import DEFAULT_PIPELINE
from opgen.runtime.passes.fusion.attention import fuse_decode_attention
from opgen.runtime.passes.fusion.attention_writes import fuse_attention_writes
from opgen.runtime.passes.fusion.cache_writes import fuse_cache_writes
from opgen.runtime.passes.sink_updates import sink_updates
from opgen.runtime.registry import KernelRegistry


def _passes(program: Program, registry: KernelRegistry) -> Program:
    """The passes in the default pipeline's order (its others between them have nothing to do here)."""
    program = sink_updates(fuse_decode_attention(program, registry), registry)
    return fuse_attention_writes(fuse_cache_writes(program, registry), registry)


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple, interpret: bool = False,
                   checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    checks = (checks if checks is not None else []) if interpret else None
    return compile_with_pass(monkeypatch, model, example, "decode_attention", _passes, checks,
                             {"atol": 1e-5, "rtol": 1e-5}, before="attention_masks")  # fmt: skip


class PeekedCache(CacheAttention):
    """A read of the key cache between its write and the attention (its first position's sum, added)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        peek = self.k_cache[:, :, 0].sum()
        mask = self.causal[None, None, pos]
        return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True) + peek


class CountedCache(CacheAttention):
    """transformers' static cache: the writes' position is an offset plus a counter the step bumps after
    its writes; the mask comes from the step's position."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.register_buffer("count", torch.zeros(1, dtype=torch.long))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        at = torch.arange(1, device=self.count.device) + self.count
        self.k_cache.index_copy_(2, at, k)  # as transformers' StaticCache writes
        self.v_cache.index_copy_(2, at, v)
        self.count.add_(1)
        mask = self.causal[None, None, pos]  # from the step's position, as transformers' mask
        return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)


def test_a_counted_caches_position_is_summed_in_the_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    model, eager = (CountedCache(heads=8, kv_heads=2, length=40, dim=16) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    eager.load_state_dict(model.state_dict())  # as compiling left the caches and the counter
    attention = next(s for s in specs if s.describe.startswith("decode attention"))
    assert attention.describe.endswith("storing the step's keys and values first")
    assert "at = tl.load(at0) + tl.load(at1)" in attention.source  # the offset and the counter
    assert all(not s.describe.startswith("cache write kernel, 2 write") for s in specs)  # the bump's stays alone
    run_steps(compiled, eager, model, range(3, 8))
    assert int(model.count) == int(eager.count)


@pytest.mark.parametrize("kernel", ["row", "group"])
def test_the_writes_join_the_attention_and_the_aten_side_matches(monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    if kernel == "row":
        one_row_kernels(monkeypatch)
    model, eager = (CacheAttention(heads=8, kv_heads=2, length=40, dim=16) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    assert len(specs) == 1, [s.describe for s in specs]  # no cache-write kernel left
    (spec,) = specs
    assert spec.describe.endswith(", storing the step's keys and values first"), spec.describe
    assert spec.inputs[1:3] == ("b_k_cache", "b_v_cache")
    assert {v.name for v in spec.writes} >= {"b_k_cache", "b_v_cache"}  # written in place, as the writes did
    name = spec.name
    assert f"def {name}(q, k, v, mask, nk, nv, at0, out, BLOCK_S" in spec.source  # 40 keys: no split buffers
    source = spec.source
    stores = source.index("tl.store(k + ")
    assert "at = tl.load(at0)" in source and stores < source.index("tl.debug_barrier()")
    assert source.index("tl.debug_barrier()") < source.index("for block in range(")  # then the cache
    # every load that needs nothing is issued before anything waits: the mask's row, the position, the rows
    # (not guarded by the position: only the stores are), so they cost one round trip to memory together
    first = [source.index(load) for load in ("row_mask = tl.load(", "at = tl.load(at0)", "vr = tl.load(nv")]
    assert max(first) < stores < source.index("keep = row_mask") and "mask=fits" in source
    assert "if (at >= 0)" not in source
    assert any("index_put" in n for n in spec.nodes)  # the ATen side runs the writes, then the attention
    run_steps(compiled, eager, model, range(3, 12))


def test_a_read_of_the_cache_between_keeps_them_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    model, eager = (PeekedCache(heads=8, kv_heads=2, length=40, dim=16) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    assert sorted(s.describe.split(",")[0] for s in specs) == ["cache write kernel", "decode attention"]
    run_steps(compiled, eager, model, range(3, 6))


def test_a_kernel_of_fresh_outputs_between_does_not_keep_them_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole pipeline as on CUDA: the additive mask's pointwise kernel lands between the writes and the
    attention; it writes nothing but its output, so the writes still join the attention."""

    monkeypatch.setattr(pipeline, "run_passes", run_passes_as_if_cuda)
    model, eager = (CacheAttention(heads=8, kv_heads=2, length=40, dim=16, mask="additive") for _ in range(2))
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        compiled = opgen.compile(model, inputs(model, 0), passes=DEFAULT_PIPELINE, cache=False)
    eager.load_state_dict(model.state_dict())  # as compiling left the caches and the counter
    jit = compiled.report().jit  # type: ignore[attr-defined]
    assert any(line.startswith("fused fused") and "pointwise" in line for line in jit), jit  # the mask's kernel
    assert [line for line in jit if "decode attention" in line and "storing the step's keys" in line], jit
    assert not [line for line in jit if "cache write kernel" in line], jit
    run_steps(compiled, eager, model, range(1, 6))


@interpreter
@pytest.mark.parametrize("kernel", ["row", "group"])
@pytest.mark.parametrize("length", [70, 600])  # one program a row or group; up to 16
def test_the_kernel_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                               kernel: str, length: int) -> None:  # fmt: skip
    """Every config: the output and both caches equal eager's at the first position, one inside, the last."""
    if ran_in_fresh_interpreter(request):
        return
    if kernel == "row":
        one_row_kernels(monkeypatch)
    model, eager = (CacheAttention(heads=4, kv_heads=2, length=length) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    checks: list[str] = []
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model), interpret=True, checks=checks)
    assert spec.describe.endswith("storing the step's keys and values first")
    run_steps(compiled, eager, model, (0, length // 2, length - 1))
    assert checks == [spec.name] * 3


@interpreter
@pytest.mark.parametrize("kernel", ["row", "group"])
@pytest.mark.parametrize("length", [70, 600])
def test_the_kernel_reads_the_rows_it_stored(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                            kernel: str, length: int) -> None:  # fmt: skip
    """Launched alone on caches that lack the step's rows (the binding's check runs the ATen side first,
    which stores them): every config stores them where eager does and attends to them."""
    if ran_in_fresh_interpreter(request):
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from opgen.runtime.execution.fused import load_function
    from opgen.runtime.passes.fusion.attention import splits_for

    if kernel == "row":
        one_row_kernels(monkeypatch)
    model = CacheAttention(heads=4, kv_heads=2, length=length)
    _, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model))
    fn = load_function(spec, prefix="opgen_attention_writes")
    rows, programs = 4, 4 if kernel == "row" else 2
    splits = splits_for(programs, length)
    assert spec.inputs[6] == "pos" and len(spec.inputs) == 7 + 2 * (splits > 1)  # then the rows: views of k, v
    for pos in (0, length // 2, length - 1):
        q, k, v, at = inputs(model, pos)
        eager = CacheAttention(heads=4, kv_heads=2, length=length)
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            want = eager(q, k, v, at)
        for meta, warps, _, grid in spec.configs:
            caches = model.k_cache.clone(), model.v_cache.clone()
            scratch = (torch.empty(rows * splits * (16 + 2)), torch.zeros(programs, dtype=torch.int32))
            out = torch.empty_like(q)
            mask = model.causal[None, None, at]
            fn[grid](q, *caches, mask, k, v, at, *(scratch if splits > 1 else ()), out, **dict(meta), num_warps=warps)
            torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(caches[0], eager.k_cache, atol=0, rtol=0)
            torch.testing.assert_close(caches[1], eager.v_cache, atol=0, rtol=0)
            assert not scratch[1].any()  # the counters are zero again for the next launch
        model.load_state_dict(eager.state_dict())  # the next position on the caches as eager left them


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", [CacheAttention, CountedCache])
def test_on_the_gpu_plain_and_in_graph_mode(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                            kind: type[CacheAttention]) -> None:  # fmt: skip
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    for graphs in (False, True):
        model, eager = (kind(heads=32, kv_heads=8, length=300, dim=64, mask="additive", dtype=dtype).cuda()
                        for _ in range(2))  # fmt: skip
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            compiled = opgen.compile(model, inputs(model, 0, dtype, "cuda"), cuda_graphs=graphs, cache=False)
            eager.load_state_dict(model.state_dict())  # as compiling left the caches and the counter
            assert "storing the step's keys and values first" in str(compiled.report())
            for pos in (1, 2, 150, 299):
                example = inputs(model, pos, dtype, "cuda")
                torch.testing.assert_close(compiled(*example), eager(*example), atol=tol, rtol=tol)
        torch.testing.assert_close(model.k_cache, eager.k_cache, atol=0, rtol=0)
        torch.testing.assert_close(model.v_cache, eager.v_cache, atol=0, rtol=0)
