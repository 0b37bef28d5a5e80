"""The cache-writes pass: which `index_put_` writes into a KV cache it runs as one kernel, the ATen side
it keeps, and the Triton kernel itself.

On the CPU the program is relabelled as CUDA around the pass (as for the fusion, gemv and attention
passes); each kernel is bound to its ATen calls, or, where triton is installed and there is no GPU,
run in Triton's interpreter with every config and checked against them. With a GPU the kernel runs
for real, plain and in CUDA-graph mode.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
from fusion_interp import compile_with_pass, ran_in_fresh_interpreter
from torch import nn

import opgen
from opgen.runtime.execution import fused as fused_module
from opgen.runtime.ir import FusedKernel, Input, KernelCall, Program, Ref, Return, TensorConstant, TensorMeta, Value
from opgen.runtime.passes.fusion.cache_writes import fuse_cache_writes
from opgen.runtime.passes.sink_updates import is_update, sink_updates
from opgen.runtime.pipeline import default_registry
from opgen.runtime.registry import KernelRegistry

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton, run in its interpreter on a machine without a GPU",
)


class Cache(nn.Module):
    """A layer's key/value cache [1, KVH, S, D] written at `pos` along dim 2, then read."""

    def __init__(self, how: str = "index_put", kv_heads: int = 2, length: int = 24, dim: int = 8,
                 dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        super().__init__()
        self.how = how
        self.register_buffer("k_cache", torch.zeros(1, kv_heads, length, dim, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(1, kv_heads, length, dim, dtype=dtype))

    def forward(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.how == "index_put":  # gpt-fast's KVCache
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v
        elif self.how == "index_copy":  # transformers' StaticCache
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
        elif self.how == "between":  # a computation between the writes that touches neither buffer
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v * 2
        elif self.how == "apart":  # the second write's values read what the first wrote
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v + self.k_cache[:, :, :1]
        elif self.how == "accumulate":
            torch.ops.aten.index_put_.default(self.k_cache, [None, None, pos], k, True)
            torch.ops.aten.index_put_.default(self.v_cache, [None, None, pos], v, True)
        return self.k_cache.sum(2) + self.v_cache.sum(2)


class CountedCache(nn.Module):
    """transformers' static cache layer as its export wrapper runs it: a position counter per layer, set
    from `cache_position` at the top, the write positions `arange(n) + counter`, the counter advanced."""

    def __init__(self, layers: int = 2, kv_heads: int = 2, length: int = 24, dim: int = 8) -> None:
        super().__init__()
        self.layers = layers
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(1, kv_heads, length, dim))
            self.register_buffer(f"v{i}", torch.zeros(1, kv_heads, length, dim))
            self.register_buffer(f"counter{i}", torch.zeros(1, dtype=torch.long))

    def forward(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for i in range(self.layers):
            getattr(self, f"counter{i}").copy_(pos[0])
        out = []
        for i in range(self.layers):
            counter, key = getattr(self, f"counter{i}"), k * (i + 1)  # the values first, as in a layer
            at = torch.arange(k.shape[2], device=k.device) + counter
            counter.add_(k.shape[2])
            getattr(self, f"k{i}").index_copy_(2, at, key)
            getattr(self, f"v{i}").index_copy_(2, at, v)
            out.append(getattr(self, f"k{i}").sum(2) + getattr(self, f"v{i}").sum(2))
        return torch.stack(out)


def inputs(model: Cache, positions: list[int], device: str = "cpu") -> tuple[torch.Tensor, ...]:
    _, kv, _, dim = (model.k_cache if isinstance(model, Cache) else model.k0).shape
    gen = torch.Generator().manual_seed(positions[0] % 97)
    dtype = next(iter(model.buffers())).dtype
    k, v = (torch.randn(1, kv, len(positions), dim, generator=gen).to(dtype) for _ in range(2))
    return k.to(device), v.to(device), torch.tensor(positions, device=device)


def compile_on_cpu(monkeypatch: pytest.MonkeyPatch, model: nn.Module, example: tuple, interpret: bool = False,
                   checks: list[str] | None = None, sink: bool = True) -> tuple[object, list[FusedKernel]]:  # fmt: skip
    """Compiled with the pass, after `sink_updates` (as the default pipeline on CUDA runs them; `sink`
    False: the pass alone), as if on CUDA; kernels bound to their ATen side, or to the interpreter."""
    checks = (checks if checks is not None else []) if interpret else None

    def run(program: Program, registry: KernelRegistry) -> Program:
        return fuse_cache_writes(sink_updates(program, registry) if sink else program, registry)

    return compile_with_pass(monkeypatch, model, example, "cache_writes", run, checks)


def run_steps(
    compiled: object, eager: nn.Module, model: nn.Module, steps: list[list[int]], device: str = "cpu"
) -> None:
    for positions in steps:
        example = inputs(model, positions, device)  # type: ignore[arg-type]
        with torch.no_grad():
            want = eager(*example)
            got = compiled(*example)  # type: ignore[operator]
        torch.testing.assert_close(got, want)
        for (name, mine), theirs in zip(model.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0, msg=name)  # the writes land where eager's do


def pair(kind: type = Cache, **kw) -> tuple:  # type: ignore[no-untyped-def,type-arg]
    model, eager = kind(**kw), kind(**kw)
    eager.load_state_dict(model.state_dict())
    return model, eager


@pytest.mark.parametrize("how", ["index_put", "index_copy"])
def test_a_layers_two_writes_are_one_kernel_and_the_aten_side_matches(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    model, eager = pair(how=how)
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model, [3]))
    assert len(specs) == 1, compiled.report()  # type: ignore[attr-defined]
    (spec,) = specs
    assert spec.outputs == () and [v.name for v in spec.writes] == ["b_k_cache", "b_v_cache"]
    assert spec.inputs[1::2] == ("b_k_cache", "b_v_cache")  # the buffers themselves, written in place
    forward = compiled.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    assert "index_put_(" not in forward and f"{spec.local}(" in forward
    artifact = compiled.artifact  # type: ignore[attr-defined]
    assert type(artifact).from_json(artifact.to_json()).fused[0].writes == spec.writes  # the disk cache keeps them
    run_steps(compiled, eager, model, [[p] for p in (0, 5, 23, 6)])


@pytest.mark.parametrize("sink", [True, False])
def test_a_counted_cache_computes_its_positions_and_sets_its_counters_in_one_kernel(
    monkeypatch: pytest.MonkeyPatch, sink: bool
) -> None:
    """The counters' bumps (`add_(counter, n)`, one per layer) run last, as one kernel, once `sink_updates`
    has moved them there; without it each stays where it was, an ATen call between the layer's lines."""
    model, eager = pair(CountedCache)
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model, [3]), sink=sink)
    describe = sorted(s.describe.split(":")[0] for s in specs)
    assert describe == [
        "cache write kernel, 2 copies into buffers",
        *(["cache write kernel, 2 update(s) of buffers"] if sink else []),
        "cache write kernel, 2 write(s) at 1 position(s) of a sum",
        "cache write kernel, 2 write(s) at 1 position(s) of a sum",
    ], describe
    writes = next(s for s in specs if "sum" in s.describe)
    assert writes.lines[0].target == "aten.add.Tensor" and "p = tl.load(index0" in writes.source
    forward = compiled.artifact.source.split("def forward(")[1].split("def forward_profiled")[0]  # type: ignore[attr-defined]
    if sink:
        (bumps,) = (s for s in specs if "update" in s.describe)
        assert "add_scalar_(" not in forward and forward.index(f"{bumps.local}(") > forward.rindex(f"{writes.local}(")
        assert bumps.source.count("x = x + 1") == 2 and [v.name for v in bumps.writes] == ["b_counter0", "b_counter1"]
        assert [line.kernel for line in bumps.lines] == ["add_scalar_", "add_scalar_"]  # the ATen side
    else:
        assert forward.index(f"{writes.local}(") < forward.index("add_")  # the kernel reads the counter before it moves
    run_steps(compiled, eager, model, [[p] for p in (0, 5, 23, 6)])


def test_an_update_moves_last_only_where_nothing_after_it_touches_its_buffer() -> None:
    """Hand-built IR: a bump of a buffer read later stays; one of a CPU buffer stays; the others move to
    the end, in their order."""

    def meta(device: str = "cuda:0") -> TensorMeta:
        return TensorMeta((1,), (1,), "int64", device)

    def bump(buffer: str, by: int | float = 1) -> KernelCall:
        return KernelCall("add_scalar_", (Ref(buffer), by), (), (), f"bump_{buffer}", "aten.add.Tensor",
                          mutates=(buffer,))  # fmt: skip

    def read(buffer: str, out: str) -> KernelCall:
        return KernelCall("clone", (Ref(buffer),), (), (Value(out, meta()),), f"read_{buffer}", "aten.clone.default")

    buffers = ("a", "b", "c", "d")
    constants = tuple(TensorConstant(n, n, meta("cpu" if n == "d" else "cuda:0"), mutable=True) for n in buffers)
    body = (
        bump("a"),
        bump("b"),
        read("b", "rb"),
        bump("c", 2),
        bump("d"),
        read("x", "rx"),
        Return((Ref("rb"), Ref("rx"))),
    )
    program = Program("forward", (Input("x", meta()),), constants, (), body)
    moved = sink_updates(program, default_registry()).body
    assert [getattr(line, "node", None) for line in moved] == ["bump_b", "read_b", "bump_d", "read_x", "bump_a",
                                                                 "bump_c", None]  # fmt: skip
    assert sink_updates(replace(program, body=moved), default_registry()).body == moved  # nothing left to move
    assert not is_update(bump("a", True)) and not is_update(read("a", "r"))  # a bool is not a number


def test_the_kernel_source_reads_like_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Cache(kv_heads=2, length=24, dim=8)
    _, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model, [3]))
    assert (
        spec.name.startswith("cache_write_")
        and f"def {spec.name}(index0, dst0, values0, dst1, values1, BLOCK" in spec.source
    )
    assert "# 1x2x1x8 into 1x2x24x8 along dim 2" in spec.source and "p = tl.where(p < 0, p + 24, p)" in spec.source
    assert "if pid < (16 + BLOCK - 1) // BLOCK:" in spec.source and "else:" in spec.source
    assert {dict(meta)["BLOCK"] for meta, *_ in spec.configs} == {32} and spec.configs[0][3] == (2,)
    assert spec.describe == "cache write kernel, 2 write(s) at 1 position(s): 1x2x1x8, 1x2x1x8"


def test_layers_share_one_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Cache(), Cache()

        def forward(self, k, v, pos):  # type: ignore[no-untyped-def]
            return self.a(k, v, pos) + self.b(k * 2, v, pos)

    model = Two()
    _, specs = compile_on_cpu(monkeypatch, model, inputs(model.a, [1]))
    assert len(specs) == 2 and len({s.source for s in specs}) == 1


@pytest.mark.parametrize(("how", "kernels"), [("between", [2]), ("apart", [1, 1])])
def test_what_lies_between_two_writes_decides_whether_they_share_a_kernel(
    monkeypatch: pytest.MonkeyPatch, how: str, kernels: list[int]
) -> None:
    model, eager = pair(how=how)
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model, [2]))
    assert [len(s.writes) for s in specs] == kernels
    run_steps(compiled, eager, model, [[2], [0], [9]])


def test_accumulating_writes_stay_with_aten(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Cache(how="accumulate")
    _, specs = compile_on_cpu(monkeypatch, model, inputs(model, [2]))
    assert specs == []


def test_nothing_changes_on_the_cpu() -> None:
    model = Cache()
    with torch.no_grad():
        plain = opgen.compile(model.eval(), inputs(model, [1]), passes=("reinplace", "cache_writes"), cache=False)
    assert plain.artifact.fused == ()  # type: ignore[attr-defined]


@interpreter
@pytest.mark.parametrize("how", ["index_put", "index_copy"])
@pytest.mark.parametrize("positions", [[0], [-1], [3, 4, 5, 6]], ids=["first", "negative", "prefill"])
def test_the_kernel_matches_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
                                                how: str, positions: list[int]) -> None:  # fmt: skip
    if how == "index_copy" and positions == [-1]:
        pytest.skip("index_copy_ refuses negative positions in eager")
    if ran_in_fresh_interpreter(request):
        return
    model, eager = pair(how=how, length=40, dim=16)
    checks: list[str] = []
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model, positions), interpret=True, checks=checks)
    steps = [positions, [p + 7 for p in positions], [p - 2 for p in positions]] if positions != [0] else [[0], [39]]
    run_steps(compiled, eager, model, steps)
    assert len(checks) == len(steps) and checks[0] == specs[0].name


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["index_put", "index_copy"])
def test_on_the_gpu_plain_and_in_graph_mode(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, how: str) -> None:
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    for graphs in (False, True):
        model, eager = (m.cuda() for m in pair(how=how, kv_heads=8, length=300, dim=64, dtype=dtype))
        with torch.no_grad():
            compiled = opgen.compile(model, inputs(model, [0], "cuda"), cuda_graphs=graphs, cache=False)
        assert "cache write kernel" in str(compiled.report())
        run_steps(compiled, eager, model, [[p] for p in (0, 1, 150, 299, 7)], "cuda")


@cuda
def test_a_counted_cache_on_the_gpu_bumps_its_counters_last_in_one_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default pipeline on a GPU: the counters' bumps sunk to the end and run as one kernel, in graph mode."""
    monkeypatch.setenv("OPGEN_FORCE_KERNEL", "triton")
    model, eager = (m.cuda() for m in pair(CountedCache, layers=3, length=64))
    with torch.no_grad():
        compiled = opgen.compile(model, inputs(model, [0], "cuda"), cuda_graphs=True, cache=False)
    assert "3 update(s) of buffers" in str(compiled.report())
    run_steps(compiled, eager, model, [[p] for p in (0, 1, 40, 63, 7)], "cuda")


@interpreter
def test_a_counted_caches_kernels_match_in_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                                            request: pytest.FixtureRequest) -> None:  # fmt: skip
    if ran_in_fresh_interpreter(request):
        return
    model, eager = pair(CountedCache, length=40)
    checks: list[str] = []
    compiled, specs = compile_on_cpu(monkeypatch, model, inputs(model, [0]), interpret=True, checks=checks)
    run_steps(compiled, eager, model, [[0], [17], [39]])
    assert len(specs) == 4 and len(checks) == 12  # the copies, the two layers' writes, the counters' bumps


@interpreter
def test_a_position_out_of_range_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if ran_in_fresh_interpreter(request):
        return
    model = Cache(length=10)
    _, (spec,) = compile_on_cpu(monkeypatch, model, inputs(model, [1]), interpret=True, checks=[])
    fn = fused_module.load_function(spec, prefix="opgen_interpreted")
    k, v, _ = inputs(model, [1])
    for position in (10, -11, 1 << 40):
        caches = torch.zeros(1, 2, 10, 8), torch.zeros(1, 2, 10, 8)
        meta, warps, _, grid = spec.configs[0]
        fn[grid](torch.tensor([position]), caches[0], k, caches[1], v, **dict(meta), num_warps=warps)
        assert not caches[0].any() and not caches[1].any()  # eager stops with an error instead
