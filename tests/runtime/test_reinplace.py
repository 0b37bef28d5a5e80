"""The reinplace pass (`opgen.runtime.passes.reinplace`): functional writes into buffers become in-place.

Each model is compiled with `opgen.compile` and stepped in lockstep with an eager copy, comparing the
outputs and the buffers after every step; the generated source shows the in-place kernel and no
write-back. Negative cases stay functional and still match eager.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from torch import nn

import opgen
from opgen import kernel_ops
from opgen.runtime.artifact.compiled import compiled_graph
from opgen.runtime.codegen.python import emit
from opgen.runtime.execution import executor
from opgen.runtime.ir import (
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
from opgen.runtime.passes import DEFAULT_PIPELINE
from opgen.runtime.passes.regions import select_meta, slice_meta, within
from opgen.runtime.passes.reinplace import reinplace

STEPS = 12
LEN = 16


class GptFastCache(nn.Module):
    """gpt-fast's KVCache: `k_cache[:, :, input_pos] = k` (index_put_)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 2, LEN, 4))
        self.register_buffer("v_cache", torch.zeros(1, 2, LEN, 4))

    def forward(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        scores = (k * self.k_cache).sum(-1, keepdim=True)
        return (scores.softmax(2) * self.v_cache).sum(2)


class HfCache(nn.Module):
    """transformers' StaticCache: `index_copy_` along the sequence dimension; the caches are read after."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, LEN, 4))
        self.register_buffer("values", torch.zeros(1, 2, LEN, 4))

    def forward(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(2, pos, k)
        self.values.index_copy_(2, pos, v)
        return torch.softmax(k @ self.keys.transpose(2, 3), -1) @ self.values


class SliceWrites(nn.Module):
    """Writes through slices: `copy_` into a slice, `index_copy_` into a batch slice (slice_scatter)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.zeros(1, 2, LEN, 4))
        self.register_buffer("batch", torch.zeros(3, 2, LEN, 4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.window[:, :, 2:3] = self.window[:, :, 2:3] + k  # read, then write the same slice
        self.batch[:1].index_copy_(2, pos, v)
        self.steps.copy_(self.steps + 1)
        return self.window.sum(2) + self.batch[:1].sum(2) * self.steps


class Twice(nn.Module):
    """Two writes into one buffer in one step (the second reads the first's result)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, LEN, 4))

    def forward(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(2, pos, k)
        self.cache[:, :, pos + 1] = self.cache[:, :, pos] + v
        return self.cache.sum(2)


class ViewWrites(nn.Module):
    """Writes through views of the buffer: a reshape, nested slices, a slice_scatter, an int index, a transpose."""

    def __init__(self, write: str) -> None:
        super().__init__()
        self.write = write
        self.register_buffer("cache", torch.zeros(LEN, 2, 4))

    def forward(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.write == "reshaped":
            self.cache.view(LEN, 8).index_copy_(0, pos, k.reshape(1, 8))
        elif self.write == "nested_slices":
            self.cache[2:10][1:5].index_copy_(0, pos % 4, k.reshape(1, 2, 4))
        elif self.write == "slice_scatter":  # a new value for the slice: copied into a view of the buffer
            self.cache.copy_(self.cache.slice_scatter(k.reshape(1, 2, 4) + self.cache[0:1], 0, 3, 4))
        elif self.write == "int_index":  # capture keeps select_scatter whole: a copy_ into the selected view
            self.cache[5] = k.reshape(2, 4)
        else:  # the result of writing a transposed view has other strides: kept functional
            self.cache.transpose(0, 1).index_copy_(1, pos, k.reshape(2, 1, 4))
        return self.cache.sum(0) * v.reshape(2, 4)


class OldValueRead(nn.Module):
    """The old value of the buffer is read after the new one is computed: the write must stay functional."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, LEN, 4))

    def forward(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        new = self.cache.index_copy(2, pos, k)
        old = self.cache * 2  # after `new` in the graph: reads the value before the write
        self.cache.copy_(new)
        return old.sum(2) + new.sum(2)


def step_inputs(step: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(step)
    return torch.tensor([step % (LEN - 1)]), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)


def run_in_lockstep(model: nn.Module) -> Any:
    eager = copy.deepcopy(model)
    with torch.no_grad():
        compiled = opgen.compile(model, step_inputs(0), recompile=False, cache=False)
        for step in range(STEPS):
            got, want = compiled(*step_inputs(step)), eager(*step_inputs(step))
            torch.testing.assert_close(got, want, msg=lambda m, s=step: f"step {s}: {m}")
            for (name, buf), (_, ref) in zip(model.named_buffers(), eager.named_buffers(), strict=True):
                torch.testing.assert_close(buf, ref, msg=lambda m, s=step, n=name: f"step {s}, buffer {n}: {m}")
    return compiled


def forward_source(compiled: Any) -> str:
    source = compiled.artifact.source
    return source[source.index("def forward(") : source.index("def forward_profiled")]


def write_backs(source: str) -> list[str]:
    return re.findall(r"\n\s*copy_\(b_\w+, \w+\)\s+# write back", source)


@pytest.mark.parametrize("model", [GptFastCache, HfCache], ids=["gpt_fast_index_put", "hf_index_copy"])
def test_kv_cache_writes_one_slot_in_place(model: type[nn.Module]) -> None:
    compiled = run_in_lockstep(model())
    source = forward_source(compiled)
    assert source.count("index_put_(b_") == 2, source
    assert "index_put(" not in source and not write_backs(source), source
    assert any("reinplace: 2 buffers written in place" == n for n in compiled.report().notes)
    assert len(compiled.artifact.written_constants) == 2  # still written: CUDA graphs save and restore them


class ShardedCache(GptFastCache):
    """A tensor-parallel rank's cache: its heads sliced from the whole one and cloned, which keeps the size-1
    batch dimension's stride (256, not a fresh tensor's 128)."""

    def __init__(self) -> None:
        super().__init__()
        self.k_cache = torch.zeros(1, 4, LEN, 4)[:, :2].clone()
        self.v_cache = torch.zeros(1, 4, LEN, 4)[:, 2:].clone()


def test_a_buffer_whose_size_one_dim_has_another_stride_is_written_in_place() -> None:
    model = ShardedCache()
    assert model.k_cache.stride() == (256, 64, 4, 1)
    compiled = run_in_lockstep(model)
    source = forward_source(compiled)
    assert source.count("index_put_(b_") == 2 and not write_backs(source), source
    assert any("reinplace: 2 buffers written in place" == n for n in compiled.report().notes), compiled.report()


def test_writes_through_slices_copy_into_the_view() -> None:
    compiled = run_in_lockstep(SliceWrites())
    source = forward_source(compiled)
    assert "slice_scatter" not in source and "index_put(" not in source and not write_backs(source), source
    assert "index_put_(" in source and "copy" not in source.replace("run the copy below", ""), source
    # `window[..., 2:3] = window[..., 2:3] + k` adds into the slice; `steps.copy_(steps + 1)` adds into steps
    assert re.search(r"add_\(buf\d+, k\)", source) and "add_scalar_(b_steps, 1)" in source, source
    assert set(compiled.artifact.written_constants) == {"window", "batch", "steps"}


@pytest.mark.parametrize("write", ["reshaped", "nested_slices", "slice_scatter", "int_index", "transposed"])
def test_writes_through_views(write: str) -> None:
    compiled = run_in_lockstep(ViewWrites(write))
    source = forward_source(compiled)
    in_place = write != "transposed"
    assert (not write_backs(source)) is in_place and ("scatter(" not in source or not in_place), source
    if write in ("slice_scatter", "int_index"):  # the view of the buffer is set up once (hoist_views), written
        view_of = r"slice\(b_cache, 0, 3, 4\)" if write == "slice_scatter" else r"select\(b_cache, 0, 5\)"
        view = re.search(rf"(buf\d+) = {view_of}", compiled.artifact.source)
        assert view and f"copy_({view[1]}, " in source, compiled.artifact.source
    else:
        assert ("index_put_(" in source) is in_place, source


def test_two_writes_into_one_buffer_in_one_step() -> None:
    source = forward_source(run_in_lockstep(Twice()))
    assert source.count("index_put_(b_cache") == 2 and not write_backs(source), source


def test_old_value_read_after_the_write_stays_functional() -> None:
    compiled = run_in_lockstep(OldValueRead())
    source = forward_source(compiled)
    assert "index_put(b_cache" in source and len(write_backs(source)) == 1, source
    assert any("kept functional: b_cache" in n for n in compiled.report().notes), compiled.report()


def test_an_input_is_written_in_place_only_where_the_caller_mutates_it() -> None:
    def mutates(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(2, pos, k)
        return cache.sum(2)

    def reads(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return cache.index_copy(2, pos, k).sum(2)  # a new tensor: the caller's cache stays as it was

    for fn, mutated in ((mutates, True), (reads, False)):
        cache, expected = torch.zeros(1, 2, LEN, 4), torch.zeros(1, 2, LEN, 4)
        with torch.no_grad():
            compiled = opgen.compile(fn, (cache.clone(), *step_inputs(0)[:2]), recompile=False, cache=False)
            for step in range(STEPS):
                pos, k, _ = step_inputs(step)
                torch.testing.assert_close(compiled(cache, pos, k), fn(expected, pos, k))
                torch.testing.assert_close(cache, expected)
        assert bool(cache.abs().sum()) is mutated
        source = forward_source(compiled)
        assert ("index_put_(args_0" in source) is mutated and ("index_put(args_0" in source) is not mutated, source
        assert "copy_(args_0" not in source, source


def test_the_pass_runs_before_constant_folding_and_memory_planning() -> None:
    order = list(DEFAULT_PIPELINE)
    assert order.index("shapes") < order.index("reinplace") < order.index("constants") < order.index("memory")


# --- on hand-built IR -------------------------------------------------------------------------------


def meta(*shape: int, dtype: str = "float32") -> TensorMeta:
    return TensorMeta(shape, contiguous_strides(shape), dtype, "cpu")


def write_back(buffer: str, value: str) -> KernelCall:
    return KernelCall("copy_", (Ref(buffer), Ref(value)), (), (), f"write back {buffer}", "aten.copy_.default",
                      mutates=(buffer,))  # fmt: skip


def run(program: Program, constants: dict[str, torch.Tensor], *inputs: torch.Tensor) -> Any:
    graph = compiled_graph("r" * 64, program, emit(program))
    return executor.bind(graph, constants, executor.Runtime(lambda *a: None), kernel_ops)(*inputs)


CACHE = TensorConstant("cache", "cache", meta(2, 6, 3), mutable=True)
POS, SRC = Input("pos", meta(2, dtype="int64")), Input("src", meta(2, 2, 3))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
def test_index_copy_is_index_put_with_leading_nones(dim: int) -> None:
    """The rewrite of an unbound index_copy_: index_put_ with `None` for each dimension before `dim`."""
    torch.manual_seed(dim)
    base = torch.randn(3, 5, 4)
    index = torch.randperm(base.shape[dim])[:2]
    src = torch.randn(base.index_select(dim, index).shape)
    want = base.clone().index_copy_(dim, index, src)
    got = kernel_ops.index_put_(base.clone(), (None,) * (dim % 3) + (index,), src)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_fallback_index_copy_becomes_index_put_() -> None:
    args, new = (Ref("cache"), 1, Ref("pos"), Ref("src")), (Value("new", meta(2, 6, 3)),)
    ip = KernelCall("aten.index_copy.default", args, (), new, "index_copy", "aten.index_copy.default", fallback=True)
    read = KernelCall("sum_dim", (Ref("new"), (1,)), (), (Value("out", meta(2, 3)),), "sum", "aten.sum.dim_IntList")
    p = Program(
        "forward", (POS, SRC), (CACHE,), (), (ip, read, write_back("cache", "new"), Return((Ref("out"),), "single"))
    )
    out = reinplace(p, registry())
    assert [line.kernel for line in out.body if isinstance(line, KernelCall)] == ["index_put_", "sum_dim"]
    assert out.body[0].args[1] == (None, Ref("pos"))
    cache, pos, src = torch.randn(2, 6, 3), torch.tensor([4, 1]), torch.randn(2, 2, 3)
    want = cache.clone().index_copy_(1, pos, src)
    torch.testing.assert_close(run(out, {"cache": cache}, pos, src), want.sum(1))
    torch.testing.assert_close(cache, want)


def test_a_returned_result_or_an_unknown_view_keeps_the_buffer_functional() -> None:
    ip = KernelCall("index_put", (Ref("cache"), (None, Ref("pos")), Ref("src")), (), (Value("new", meta(2, 6, 3)),),
                    "index_put", "aten.index_put.default")  # fmt: skip
    p = Program("forward", (POS, SRC), (CACHE,), (), (ip, write_back("cache", "new"), Return((Ref("new"),), "single")))
    out = reinplace(p, registry())
    assert out.body == p.body and "kept functional: cache" in out.notes[-1]
    cache, pos, src = torch.randn(2, 6, 3), torch.tensor([4, 1]), torch.randn(2, 2, 3)
    result = run(out, {"cache": cache}, pos, src)
    assert result.data_ptr() != cache.data_ptr()  # the caller gets a fresh tensor, as before the pass
    torch.testing.assert_close(result, cache)


def test_another_write_into_the_buffer_keeps_it_functional() -> None:
    view = KernelCall(
        "slice", (Ref("cache"), 0, 0, 1), (), (Value("row", meta(1, 6, 3)),), "slice", "aten.slice.Tensor"
    )
    ip = KernelCall("index_put", (Ref("cache"), (None, Ref("pos")), Ref("src")), (), (Value("new", meta(2, 6, 3)),),
                    "index_put", "aten.index_put.default")  # fmt: skip
    zero = KernelCall("zero_", (Ref("row"),), (), (), "zero_", "aten.zero_.default", mutates=("row",))
    body = (view, ip, zero, write_back("cache", "new"), Return((), "tuple"))
    out = reinplace(Program("forward", (POS, SRC), (CACHE,), (), body), registry())
    assert out.body == body and "'zero_' writes it" in out.notes[-1]


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."), "cpu", t.storage_offset())


@pytest.mark.parametrize(
    "view", [(0, 1, 3, 1), (2, -3, None, 2), (1, None, -1, 1), (-1, 5, 2, 1), (2, -100, 100, 3), (0, 2, 2, 1)]
)
def test_slice_meta_is_torchs(view: tuple) -> None:
    base = torch.empty(4, 5, 6)[1:]
    dim, start, end, step = view
    want = torch.ops.aten.slice.Tensor(base, dim, start, end, step)
    assert slice_meta(meta_of(base), dim, start, end, step) == meta_of(want)


@pytest.mark.parametrize("view", [(0, 1), (1, -1), (-1, 2)])
def test_select_meta_is_torchs(view: tuple) -> None:
    base = torch.empty(4, 5, 6)[:, 1:]
    assert select_meta(meta_of(base), *view) == meta_of(base.select(*view))


def test_within_contains_views_of_dense_regions_only() -> None:
    cache = torch.empty(8, 2, 4)
    rows = meta_of(cache[2:6])
    assert within(meta_of(cache[3:5]), rows) and within(meta_of(cache[3, :, 1:]), rows) and within(rows, rows)
    assert not within(meta_of(cache[1:3]), rows) and not within(meta_of(cache[6]), rows)
    column = meta_of(cache[:, :, 1])  # not dense: elements between its own are outside it
    assert not within(meta_of(cache[3, :, 2]), column) and not within(None, rows) and not within(rows, None)


def registry() -> Any:
    from opgen.runtime.pipeline import default_registry

    return default_registry()
