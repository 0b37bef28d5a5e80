"""The decode-attention pass: which attention calls it takes (one query row over a cache, the cache's
grouped heads read in place), the ATen side it keeps, and the Triton kernel itself.

On the CPU the program is relabelled as CUDA around the pass (as for the fusion and gemv passes);
each kernel is bound to its ATen calls, or, where triton is installed and there is no GPU, run in
Triton's interpreter with every config and checked against them. With a GPU the kernels run for
real, plain and in CUDA-graph mode.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from fusion_interp import compile_with_pass, ran_in_fresh_interpreter
from torch import nn
from torch.nn import functional as F

import opgen
from opgen.runtime.ir import FusedKernel
from opgen.runtime.passes.fusion import attention as attention_pass
from opgen.runtime.passes.fusion.attention import fuse_decode_attention
from opgen.runtime.passes.repeat_kv import Operand

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)


class CacheAttention(nn.Module):
    """One decode step's attention: q [1, H, 1, D] over a cache [1, KVH, S, D] written at `pos`."""

    def __init__(self, heads: int = 8, kv_heads: int = 2, length: int = 40, dim: int = 16, how: str = "repeat_kv",
                 mask: str = "bool", dtype: torch.dtype = torch.float32, window: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.how, self.mask = heads, kv_heads, how, mask
        self.register_buffer("k_cache", torch.randn(1, kv_heads, length, dim, dtype=dtype))
        self.register_buffer("v_cache", torch.randn(1, kv_heads, length, dim, dtype=dtype))
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
        if window:  # a sliding window: each position keeps the `window` last ones
            causal &= torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1 - window)
        self.register_buffer("causal", causal)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        keys, values = self.k_cache, self.v_cache
        group = self.heads // self.kv_heads
        if self.how == "repeat_kv":  # transformers' repeat_kv
            b, h, s, d = keys.shape
            keys = keys[:, :, None].expand(b, h, group, s, d).reshape(b, h * group, s, d)
            values = values[:, :, None].expand(b, h, group, s, d).reshape(b, h * group, s, d)
        elif self.how == "repeat_interleave":  # gpt-fast's
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        row = self.causal[None, None, pos]
        fill = torch.finfo(q.dtype).min if self.mask == "additive_min" else -1e4  # transformers' fill, or a mild one
        additive = torch.zeros(row.shape, dtype=q.dtype, device=q.device).masked_fill(~row, fill)
        mask = row if self.mask == "bool" else additive
        return self.attend(q, keys, values, mask)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        extra = {"enable_gqa": True} if self.how == "gqa" else {}
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, **extra)


class EagerAttention(CacheAttention):
    """The attention written out as transformers' `eager_attention_forward` (Gemma-2's, with `softcap`): products,
    the scale, the cap, the additive mask, a float32 softmax cast back, eval-mode dropout, products."""

    def __init__(self, softcap: float | None = 1.5, scale: float = 0.25, **kw: object) -> None:
        super().__init__(mask="additive", **kw)  # type: ignore[arg-type]
        self.softcap, self.scale = softcap, scale
        self.eval()  # dropout off, as in a decode step

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(F.dropout(probs, p=0.1, training=self.training), values)


def inputs(model: CacheAttention, pos: int = 7, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple:
    dim = model.k_cache.shape[-1]
    gen = torch.Generator().manual_seed(pos)
    q = torch.randn(1, model.heads, 1, dim, generator=gen, dtype=dtype)
    k = torch.randn(1, model.kv_heads, 1, dim, generator=gen, dtype=dtype)
    v = torch.randn(1, model.kv_heads, 1, dim, generator=gen, dtype=dtype)
    return tuple(t.to(device) for t in (q, k, v, torch.tensor([pos])))


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple, interpret: bool = False,
                   checks: list[str] | None = None) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    """Compiled with the pass (as if on CUDA); kernels bound to their ATen side, or to the interpreter."""
    checks = (checks if checks is not None else []) if interpret else None
    tolerance = {"atol": 1e-5, "rtol": 1e-5}
    return compile_with_pass(monkeypatch, model, example, "decode_attention", fuse_decode_attention, checks, tolerance,
                             before="attention_masks")  # fmt: skip


def run_steps(compiled: object, eager: CacheAttention, model: CacheAttention, positions: range, **kw) -> None:
    for pos in positions:
        example = inputs(model, pos, **kw)
        with torch.no_grad():
            want = eager(*example)
            got = compiled(*example)  # type: ignore[operator]
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(model.k_cache, eager.k_cache)  # the cache writes still land


@pytest.mark.parametrize("how", ["repeat_kv", "repeat_interleave", "gqa", "none"])
@pytest.mark.parametrize("mask", ["bool", "additive"])
def test_one_kernel_reads_the_cache_in_place_and_the_aten_side_matches(
    monkeypatch: pytest.MonkeyPatch, how: str, mask: str
) -> None:
    kv_heads = 8 if how == "none" else 2
    model, eager = (CacheAttention(kv_heads=kv_heads, how=how, mask=mask) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    assert len(specs) == 1, compiled.report()  # type: ignore[attr-defined]
    (spec,) = specs
    group = 1 if how == "none" else 4
    assert spec.inputs[1:3] == ("b_k_cache", "b_v_cache")  # the buffers themselves, never a repeat of them
    assert f"{group} per key/value head" in spec.source and len(spec.outputs) == 1
    if how in ("repeat_kv", "repeat_interleave"):  # the repeat's copies left the program with the call
        forward = compiled.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
        assert sum("clone" in n for n in spec.nodes) == 2 and "copy_(" not in forward and "clone(" not in forward
    run_steps(compiled, eager, model, range(3, 12))


@pytest.mark.parametrize("mask", ["bool", "additive"])
def test_one_key_value_head_is_read_in_place_too(monkeypatch: pytest.MonkeyPatch, mask: str) -> None:
    """Multi-query attention (Gemma-2B's one key/value head): the repeat's reshape views the expanded cache, so
    export records no clone; the kernel still reads the cache itself, one program for all eight heads."""
    model, eager = (CacheAttention(kv_heads=1, mask=mask) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    assert len(specs) == 1, compiled.report()  # type: ignore[attr-defined]
    (spec,) = specs
    assert spec.inputs[1:3] == ("b_k_cache", "b_v_cache") and not any("clone" in n for n in spec.nodes)
    assert "8 per key/value head" in spec.source and "a program a group" in spec.describe
    run_steps(compiled, eager, model, range(3, 12))


@pytest.mark.parametrize("how", ["repeat_kv", "none"])
@pytest.mark.parametrize("softcap", [1.5, None])
def test_attention_written_out_is_the_same_kernel(monkeypatch: pytest.MonkeyPatch, how: str,
                                                  softcap: float | None) -> None:  # fmt: skip
    """transformers' eager attention (Gemma-2's soft-capped scores): its products, scale, cap, mask, softmax and
    casts, and the repeat's copies, all in one kernel that reads the cache in place."""
    kv_heads = 8 if how == "none" else 2
    model, eager = (EagerAttention(softcap, kv_heads=kv_heads, how=how) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    assert len(specs) == 1, compiled.report()  # type: ignore[attr-defined]
    (spec,) = specs
    assert spec.inputs[1:3] == ("b_k_cache", "b_v_cache") and "scale" not in spec.describe
    assert ("scores soft-capped at 1.5" in spec.describe) == (softcap is not None), spec.describe
    forward = compiled.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    assert "bmm(" not in forward and "softmax(" not in forward and "tanh(" not in forward, forward
    assert "0.25" in spec.source  # the eager form's own scale, not 1 / sqrt(16)
    run_steps(compiled, eager, model, range(3, 12))


class ScoresReadTwice(EagerAttention):
    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scale
        probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32)
        return torch.matmul(probs, values) + scores.sum(-1, keepdim=True)  # the scores are read besides


def test_a_written_out_attention_whose_scores_are_read_elsewhere_stays_with_aten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, eager = ScoresReadTwice(), ScoresReadTwice()
    eager.load_state_dict(model.state_dict())
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model))
    assert specs == []
    run_steps(compiled, eager, model, range(3, 6))


class HalfToFloatSoftmax(EagerAttention):
    """The eager form as CUDA records it in float16: `F.softmax(s, dtype=torch.float32)` dispatches there to one
    `_softmax(s, -1, half_to_float=True)`, with no cast before it."""

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.tanh(torch.matmul(q, keys.transpose(2, 3)) * self.scale / self.softcap) * self.softcap  # type: ignore[operator]
        probs = torch.ops.aten._softmax.default(scores + mask, -1, True).to(q.dtype)
        return torch.matmul(probs, values)


def test_cudas_float16_softmax_is_the_same_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matched only: the CPU has no half_to_float softmax to run (its numbers: the GPU cases in float16)."""
    model = HalfToFloatSoftmax().half()
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model, dtype=torch.float16))
    assert len(specs) == 1 and "scores soft-capped at 1.5" in specs[0].describe, compiled.report()  # type: ignore[attr-defined]
    forward = compiled.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    assert "softmax(" not in forward and "bmm(" not in forward, forward


def one_row_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program per query row whatever the group (the kernel a group of one takes)."""
    monkeypatch.setattr(attention_pass, "GROUPED_FROM", 1 << 30)


def test_the_kernel_source_reads_like_a_flash_decoding_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    one_row_kernels(monkeypatch)
    model = CacheAttention(heads=8, kv_heads=2, length=40, dim=16)
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model))
    assert spec.name.startswith("attention_") and f"def {spec.name}(q, k, v, mask, out, BLOCK_S" in spec.source
    assert "g = h // 4" in spec.source and f"* {1 / math.sqrt(16)!r}" in spec.source
    # the mask's kept range first, then only its blocks
    assert "lo = tl.min(tl.where(keep, every, 40), 0)" in spec.source and "start < last" in spec.source
    assert "for block in range(0, (40 + BLOCK_S - 1) // BLOCK_S)" in spec.source
    assert "tl.where(masked != 0, scores" in spec.source and "atomic" not in spec.source  # 40 keys: one program
    # a block's values are loaded beside its keys, before the scores wait for the keys: one round trip a block
    assert spec.source.index("vals = tl.load(") < spec.source.index("scores = tl.sum(keys")
    assert {dict(meta)["BLOCK_S"] for meta, *_ in spec.configs} == {32, 64} and spec.configs[0][3] == (8,)
    assert "decode attention, 8 heads of one query over 40 keys (4 per key/value head" in spec.describe
    assert "attention_split" not in compiled.artifact.source  # type: ignore[attr-defined]  # nor its buffers


def test_a_long_cache_is_split_among_programs_with_buffers_from_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    one_row_kernels(monkeypatch)
    model = CacheAttention(heads=8, kv_heads=2, length=600, dim=16)
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model))
    assert f"def {spec.name}(q, k, v, mask, part, count, out, BLOCK_S" in spec.source
    assert "split = tl.program_id(1)" in spec.source and 'tl.atomic_add(count + pid, 1, sem="acq_rel")' in spec.source
    assert "tl.atomic_xchg(count + pid, 0)" in spec.source  # the last program leaves the counter zero
    assert {grid for *_, grid in spec.configs} == {(8, 16)} and "up to 16 programs a head" in spec.describe
    assert spec.inputs[4:] == ("attention_split0_part", "attention_split0_count") and spec.written_inputs == (4, 5)
    source = compiled.artifact.source  # type: ignore[attr-defined]
    assert "attention_split0_part = empty_strided((2304,), (1,), dtype=float32" in source  # 8 rows x 16 x (16 + 2)
    assert "attention_split0_count = zeros((8,), dtype=int32" in source


def test_a_group_of_query_heads_is_one_program_of_two_dots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four query heads a key/value head: one program a group, its rows one tile (16: a dot's smallest side),
    the keys read once for all of them; the split and its counters are per group."""
    model = CacheAttention(heads=8, kv_heads=2, length=600, dim=16)
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model))
    source = spec.source
    assert source.index("vals = tl.load(") < source.index("scores = tl.dot(qs, keys")  # one round trip a block
    assert spec.name.startswith("attention_grouped_") and "4 per key/value head" in source
    assert "hs = h + tl.arange(0, 16)" in source and "h_ok = hs < h + 4" in source
    assert "tl.dot(qs, keys" in source and "tl.dot(p, vals" in source and 'input_precision="ieee"' in source
    assert "masked[None, :] != 0" in source  # the mask's one row, for every head of the group
    assert 'tl.atomic_add(count + pid, 1, sem="acq_rel")' in source and "tl.atomic_xchg(count + pid, 0)" in source
    # 2 groups of 4 rows: 256 programs a row would be 16 splits of 2 rows; the 2 groups take 16 splits too
    assert {grid for *_, grid in spec.configs} == {(2, 16)}
    assert "a program a group, up to 16 programs a group" in spec.describe
    artifact = compiled.artifact.source  # type: ignore[attr-defined]
    assert "attention_split0_part = empty_strided((2304,), (1,), dtype=float32" in artifact  # 8 rows x 16 x (16 + 2)
    assert "attention_split0_count = zeros((2,), dtype=int32" in artifact  # one counter a group


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "mask_heads", "grouped"), [
    (8, 2, 16, 1, True), (8, 8, 16, 1, False), (8, 2, 8, 1, False), (8, 2, 16, 8, False), (14, 2, 64, 1, True),
])  # fmt: skip
def test_which_attention_takes_a_program_a_group(heads: int, kv_heads: int, dim: int, mask_heads: int,
                                                 grouped: bool) -> None:  # fmt: skip
    from opgen.runtime.ir import TensorMeta

    def meta(*shape: int, dtype: str = "bfloat16") -> TensorMeta:
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return TensorMeta(shape, tuple(strides), dtype, "cuda:0")

    q, kv = meta(1, heads, 1, dim), meta(1, kv_heads, 640, dim)
    mask = Operand("mask", meta(1, mask_heads, 1, 640, dtype="bool"))
    match = attention_pass.DecodeAttention(0, None, Operand("q", q), Operand("k", kv), Operand("v", kv), mask,  # type: ignore[arg-type]
                                           heads // kv_heads, None, (0,))  # fmt: skip
    assert attention_pass.grouped(match) is grouped


@pytest.mark.parametrize(("rows", "length", "splits"), [(32, 640, 16), (256, 640, 2), (512, 640, 1), (14, 4096, 16),
                                                        (32, 40, 1), (32, 100, 2)])  # fmt: skip
def test_splits_fill_the_gpu_and_keep_pieces_of_a_block(rows: int, length: int, splits: int) -> None:
    from opgen.runtime.passes.fusion.attention import splits_for

    assert splits_for(rows, length) == splits


def test_layers_share_one_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = CacheAttention(), CacheAttention()

        def forward(self, q, k, v, pos):  # type: ignore[no-untyped-def]
            return self.b(self.a(q, k, v, pos), k, v, pos)

    model = Two()
    _, specs = compile_on_cpu(monkeypatch, model, inputs(model.a))
    assert len(specs) == 2 and len({s.source for s in specs}) == 1


class Untouched(nn.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.case == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.case == "dropout":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        return F.scaled_dot_product_attention(q, k, v)  # "prefill": several query rows


@pytest.mark.parametrize("case", ["causal", "dropout", "prefill"])
def test_what_is_not_one_query_row_stays_with_aten(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    rows = 5 if case == "prefill" else 1
    example = (torch.randn(1, 4, rows, 16), torch.randn(1, 4, 9, 16), torch.randn(1, 4, 9, 16))
    _, specs = compile_on_cpu(monkeypatch, Untouched(case), example)
    assert specs == []


# A torch.compile backend on a GPU sees attention as the backend op AOT autograd picked, with its own argument
# list and several results: (target, arguments after q, k, v, results, the lines' outputs it reads besides the first).
BACKEND_OPS = {
    "cudnn": ("_scaled_dot_product_cudnn_attention", lambda mask: (mask, False), 9),
    "efficient": ("_scaled_dot_product_efficient_attention", lambda mask: (mask, False), 4),
    "cudnn_causal": ("_scaled_dot_product_cudnn_attention", lambda mask: (mask, False, 0.0, True), 9),
    "cudnn_lse_read": ("_scaled_dot_product_cudnn_attention", lambda mask: (mask, True), 9),
}


@pytest.mark.parametrize("op", list(BACKEND_OPS))
def test_the_backend_ops_a_torch_compile_graph_has_are_taken_too(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """transformers' decode step reached the opgen backend as `_scaled_dot_product_cudnn_attention` after a
    repeat_kv copy of the whole cache (0.67 ms of a 3 ms step at batch 8 on an H200): the same kernel takes it,
    unless a result other than the output is read or the call is causal."""
    from dataclasses import replace

    from opgen.runtime.ir import KernelCall, Value

    kernel, rest, results = BACKEND_OPS[op]

    def as_backend_op(program, registry):
        body = []
        for line in program.body:
            if isinstance(line, KernelCall) and line.target == "aten.scaled_dot_product_attention.default":
                q, k, v, mask = line.args
                extra = (Value("lse", line.outputs[0].meta),) if op == "cudnn_lse_read" else ()
                outputs = (line.outputs[0], *extra, *(None,) * (results - 1 - len(extra)))
                line = replace(line, kernel=kernel, target=f"aten.{kernel}.default", args=(q, k, v, *rest(mask)),
                               outputs=outputs, unpack=True)  # fmt: skip
            body.append(line)
        return fuse_decode_attention(replace(program, body=tuple(body)), registry)

    model = CacheAttention(mask="additive")
    _, specs = compile_with_pass(monkeypatch, model, inputs(model), "decode_attention", as_backend_op,
                                 before="attention_masks")  # fmt: skip
    if op in ("cudnn_causal", "cudnn_lse_read"):
        assert specs == []
        return
    (spec,) = specs
    assert spec.describe.startswith("decode attention, 8 heads of one query over 40 keys (4 per key/value head")
    assert len(spec.outputs) == 1 and kernel in {line.target.split(".")[1] for line in spec.lines}


def test_nothing_changes_on_the_cpu() -> None:
    model = CacheAttention()
    with torch.no_grad():
        plain = opgen.compile(model.eval(), inputs(model), passes=("decode_attention",), cache=False)
    assert plain.artifact.fused == ()  # type: ignore[attr-defined]


def test_without_a_mask_the_whole_cache_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMask(CacheAttention):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v
            return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, enable_gqa=True)

    model = NoMask()
    _, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model))
    assert "hi = lo + 40" in spec.source and "mask" not in spec.source.split("BLOCK_S")[0]  # the whole cache


@interpreter
@pytest.mark.parametrize("how", ["repeat_kv", "none", "one_kv_head"])
@pytest.mark.parametrize("mask", ["bool", "additive", "additive_min"])
def test_the_kernel_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                                how: str, mask: str) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    kv_heads = {"none": 8, "one_kv_head": 1}.get(how, 2)
    how = "repeat_kv" if how == "one_kv_head" else how
    model, eager = (CacheAttention(kv_heads=kv_heads, how=how, mask=mask, length=70) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    checks: list[str] = []
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model), interpret=True, checks=checks)
    run_steps(compiled, eager, model, (0, 5, 69))  # the first position, one inside, the last
    assert len(checks) == 3 and checks[0] == specs[0].name


@pytest.mark.parametrize("dim", [24, 96])
def test_a_head_size_that_is_no_power_of_two_is_padded(monkeypatch: pytest.MonkeyPatch, dim: int) -> None:
    """Phi-3's heads of 96: `d` spans the next power of two, its lanes past the head masked in every load and store."""
    model, eager = (CacheAttention(dim=dim) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model))
    span = 1 << (dim - 1).bit_length()
    assert f"d = tl.arange(0, {span})" in spec.source and f"d_ok = d < {dim}" in spec.source
    run_steps(compiled, eager, model, range(3, 6))


@interpreter
@pytest.mark.parametrize("kernel", ["row", "group"])
@pytest.mark.parametrize(("dim", "length"), [(24, 70), (48, 600)])  # one program a row or group; split in 16
def test_a_padded_head_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                                  kernel: str, dim: int, length: int) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    if kernel == "row":
        one_row_kernels(monkeypatch)
    model, eager = (CacheAttention(heads=4, kv_heads=2, length=length, dim=dim, mask="additive_min")
                    for _ in range(2))  # fmt: skip
    eager.load_state_dict(model.state_dict())
    checks: list[str] = []
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model), interpret=True, checks=checks)
    assert ("a program a group" in spec.describe) == (kernel == "group") and "d_ok" in spec.source
    run_steps(compiled, eager, model, (0, 5, length - 1))
    assert checks == [spec.name] * 3


@interpreter
@pytest.mark.parametrize("kernel", ["row", "group"])
@pytest.mark.parametrize("softcap", [1.5, None])
def test_the_eager_forms_kernel_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                           request: pytest.FixtureRequest, kernel: str,
                                                           softcap: float | None) -> None:  # fmt: skip
    """The soft-capped scores (a cap small enough to change them) in both kernels, a cache split among programs."""
    if ran_in_fresh_interpreter(request):
        return
    if kernel == "row":
        one_row_kernels(monkeypatch)
    model, eager = (EagerAttention(softcap, heads=4, kv_heads=2, length=300) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    checks: list[str] = []
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model), interpret=True, checks=checks)
    assert ("soft-capped at 1.5" in spec.describe) == ("tl.sigmoid(scores" in spec.source) == (softcap is not None)
    run_steps(compiled, eager, model, (0, 70, 299))
    assert checks == [spec.name] * 3


@interpreter
@pytest.mark.parametrize("kernel", ["row", "group"])
@pytest.mark.parametrize(("mask", "window"), [("bool", 0), ("additive_min", 0), ("bool", 200)])
def test_the_split_kernel_matches_in_the_interpreter_at_any_fill(monkeypatch: pytest.MonkeyPatch,
                                                                 request: pytest.FixtureRequest, mask: str,
                                                                 window: int, kernel: str) -> None:  # fmt: skip
    """Up to 16 programs a row or group: one kept position, a few pieces, the whole cache, a window's middle
    range. Every config runs on the same counters one after another, so one that left them non-zero fails
    the next."""
    if ran_in_fresh_interpreter(request):
        return
    if kernel == "row":
        one_row_kernels(monkeypatch)
    model, eager = (CacheAttention(heads=4, kv_heads=2, length=600, mask=mask, window=window) for _ in range(2))
    eager.load_state_dict(model.state_dict())
    checks: list[str] = []
    compiled, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model), interpret=True, checks=checks)
    assert f"up to 16 programs a {'head' if kernel == 'row' else 'group'}" in spec.describe
    run_steps(compiled, eager, model, (0, 70, 599))
    assert checks == [spec.name] * 3


# GPU cases: (model, report line, one program a row). SDPA after each grouping; Gemma-2's soft-capped eager form;
# a head of 96 (Phi-3's), padded; in both kernels where it matters.
GPU_CASES = {
    **{how: (lambda dtype, how=how: CacheAttention(heads=32, kv_heads=8, length=300, dim=64, how=how,
                                                   mask="additive", dtype=dtype), "decode attention", False)
       for how in ("repeat_kv", "repeat_interleave", "gqa")},
    **{f"eager_{kernel}": (lambda dtype: EagerAttention(1.5, heads=8, kv_heads=4, length=300, dim=64, dtype=dtype),
                           "scores soft-capped at 1.5", kernel == "row") for kernel in ("row", "group")},
    **{f"head96_{kernel}": (lambda dtype: CacheAttention(heads=8, kv_heads=4, length=300, dim=96, mask="additive",
                                                         dtype=dtype), "decode attention", kernel == "row")
       for kernel in ("row", "group")},
    "one_kv_head": (lambda dtype: CacheAttention(heads=8, kv_heads=1, length=300, dim=256, mask="additive",
                                                 dtype=dtype), "8 per key/value head, read in place", False),
}  # fmt: skip


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_on_the_gpu_plain_and_in_graph_mode(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, case: str) -> None:
    make, line, row = GPU_CASES[case]
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    if row:
        one_row_kernels(monkeypatch)
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    if case.startswith("eager"):
        tol *= 2.5  # eager rounds its scores to the dtype before the cap
    for graphs in (False, True):
        model, eager = (make(dtype).cuda() for _ in range(2))
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            compiled = opgen.compile(model, inputs(model, 0, dtype, "cuda"), cuda_graphs=graphs, cache=False)
            assert line in str(compiled.report())
            for pos in (0, 1, 150, 299):
                example = inputs(model, pos, dtype, "cuda")
                torch.testing.assert_close(compiled(*example), eager(*example), atol=tol, rtol=tol)
        torch.testing.assert_close(model.v_cache, eager.v_cache)


@cuda
@pytest.mark.parametrize("kernel", ["row", "group"])
@pytest.mark.parametrize("mask", ["bool", "additive_min"])
def test_every_config_on_the_gpu_matches_at_any_fill_of_the_cache(monkeypatch: pytest.MonkeyPatch, mask: str,
                                                                   kernel: str) -> None:  # fmt: skip
    """Each config of the one-row and the grouped kernel launched on the GPU against the ATen calls, from a
    cache with one position kept to a full one."""
    from fusion_interp import InterpretedBinding

    from opgen.runtime.execution import fused as fused_module

    if kernel == "row":
        one_row_kernels(monkeypatch)
    checks: list[str] = []
    tolerance = {"atol": 1e-4, "rtol": 1e-4}
    monkeypatch.setattr(
        fused_module, "bindings", lambda found: {s.local: InterpretedBinding(s, checks, tolerance) for s in found}
    )
    model, eager = (CacheAttention(heads=32, kv_heads=8, length=600, dim=64, mask=mask).cuda() for _ in range(2))
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        compiled = opgen.compile(model, inputs(model, 0, device="cuda"), cache=False)
        for pos in (0, 1, 255, 256, 599):
            example = inputs(model, pos, device="cuda")
            torch.testing.assert_close(compiled(*example), eager(*example), atol=1e-4, rtol=1e-4)
    assert len([c for c in checks if c.startswith("attention_")]) == 5  # (the cache writes' kernel is checked too)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_through_the_torch_compile_backend(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """Through torch.compile the graph holds the backend op AOT autograd picked (cuDNN or efficient attention
    after the repeat's copy); the step still runs as the decode kernel, and writes the caller's cache."""
    from opgen.runtime.frontend import dynamo

    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    model, eager = (CacheAttention(heads=32, kv_heads=8, length=300, dim=64, mask="additive", dtype=dtype).cuda()
                    for _ in range(2))  # fmt: skip
    eager.load_state_dict(model.state_dict())
    made = []
    compile_graph = dynamo.compile_aten_graph
    monkeypatch.setattr(dynamo, "compile_aten_graph", lambda *a, **kw: made.append(compile_graph(*a, **kw)) or made[-1])
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="opgen", options={"cuda_graphs": True})
    with torch.no_grad():
        for pos in (0, 1, 150, 299):
            example = inputs(model, pos, dtype, "cuda")
            torch.testing.assert_close(compiled(*example), eager(*example), atol=tol, rtol=tol)
    torch.testing.assert_close(model.v_cache, eager.v_cache)
    (fn,) = made
    report = str(fn.report())
    assert "decode attention, 32 heads of one query over 300 keys" in report, report
    torch._dynamo.reset()
