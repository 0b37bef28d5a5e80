"""The JIT launcher on a GPU: results match Triton's own launch, grids, in-place kernels,
specialization, errors, autotuning without corrupting written arguments, the disk cache across
processes (hits, damaged entries), background compilation, CUDA-graph capture and the choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opgen.jit

pytestmark = pytest.mark.skipif(not opgen.jit.available(), reason="; ".join(opgen.jit.missing()) or "-")
triton = pytest.importorskip("triton")
import kernels_for_tests as K  # noqa: E402

from opgen.jit import Config, env  # noqa: E402
from opgen.jit.cache import STATS  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "cache"))
    STATS.reset()
    yield tmp_path / "cache"


def cdiv(a, b):
    return (a + b - 1) // b


@pytest.mark.parametrize("n", [1, 16, 1000, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_axpy_matches_triton(n, dtype):
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = torch.randn(n, device="cuda", dtype=dtype)
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    launch = opgen.jit.kernel(K.axpy_kernel, lambda m: (triton.cdiv(m["n"], m["BLOCK"]),), BLOCK=256)
    launch(x, y, ours, n, 0.5)
    K.axpy_kernel[(cdiv(n, 256),)](x, y, theirs, n, 0.5, BLOCK=256)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(ours, x + 0.5 * y)


def test_variants_per_specialization():
    launch = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=128)
    base = torch.randn(1025, device="cuda")
    x, y = base[:1024], torch.randn(1024, device="cuda")
    out = torch.empty(1024, device="cuda")
    launch(x, y, out, 1024, 2.0)
    assert launch.variant_count == 1
    launch(x, y, out, 1024, 3.0)  # same specialization: no new variant
    assert launch.variant_count == 1
    xs = base[1:]  # 4-byte aligned only: another specialization
    launch(xs, y, out, 1024, 2.0)
    assert launch.variant_count == 2
    torch.testing.assert_close(out, xs + 2.0 * y)
    launch(x, y, out, 1000, 1.0)  # not a multiple of 16: the aligned variant compiled for 1024 does not fit
    torch.testing.assert_close(out[:1000], x[:1000] + y[:1000])
    assert STATS.compiles == launch.variant_count == 3


def test_grids_2d_and_3d():
    x = torch.randn(37, 50, device="cuda")[:, :45]  # rows of stride 50
    out = torch.empty(37, 45, device="cuda")
    launch = opgen.jit.kernel(
        K.add_2d_kernel,
        lambda m: (triton.cdiv(m["rows"], m["BLOCK_R"]), triton.cdiv(m["cols"], m["BLOCK_C"])),
        BLOCK_R=8,
        BLOCK_C=16,
    )
    launch(x, out, 37, 45, x.stride(0))
    r = torch.arange(37, device="cuda")[:, None]
    c = torch.arange(45, device="cuda")[None, :]
    torch.testing.assert_close(out, x + r + c * 1000)
    out3 = torch.zeros(3, 4, 5, device="cuda", dtype=torch.int32)
    opgen.jit.kernel(K.grid3_kernel, (5, 4, 3), A=5, B=4)(out3)
    z, y_, x_ = torch.meshgrid(torch.arange(3), torch.arange(4), torch.arange(5), indexing="ij")
    assert torch.equal(out3.cpu(), (x_ + 10 * y_ + 100 * z).int())


def test_grid_python_fallback_when_untraceable():
    calls = []

    def grid(meta):
        calls.append(1)
        return (max(triton.cdiv(meta["n"], meta["BLOCK"]), 1),)  # max() of a traced value: not traceable

    out = torch.zeros(300, device="cuda", dtype=torch.int64)
    launch = opgen.jit.kernel(K.int_kernel, grid, BLOCK=64)
    launch(out, 300, 3)
    assert torch.equal(out.cpu(), torch.arange(300) * 3)
    assert len(calls) >= 1


def test_inplace_matches_triton():
    a = torch.randn(5000, device="cuda")
    b = a.clone()
    opgen.jit.kernel(K.scale_inplace_kernel, lambda m: (triton.cdiv(m["n"], m["BLOCK"]),), BLOCK=512)(a, 5000, 3.0)
    K.scale_inplace_kernel[(cdiv(5000, 512),)](b, 5000, 3.0, BLOCK=512)
    assert torch.equal(a, b)


def test_bad_arguments_are_clear_errors():
    launch = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=128)
    x = torch.randn(16, device="cuda")
    with pytest.raises(TypeError, match="takes 5 arguments"):
        launch(x, x, x, 16)
    with pytest.raises(ValueError, match="expected CUDA"):
        launch(x.cpu(), x, x, 16, 1.0)
    with pytest.raises(TypeError, match="argument 4 has type str"):
        launch(x, x, x, 16, "2")
    with pytest.raises(TypeError, match="by position"):
        launch(x, x, x, 16, alpha=1.0)
    with pytest.raises(opgen.jit.JitError, match="unknown name"):
        opgen.jit.kernel(K.axpy_kernel, ("cdiv(m, BLOCK)",), BLOCK=128)(x, x, x, 16, 1.0)
    with pytest.raises(TypeError, match=r"triton\.jit"):
        opgen.jit.kernel(lambda: None, (1,))


def test_autotune_does_not_corrupt_written_arguments():
    configs = [Config({"BLOCK": 128}, num_warps=4), Config({"BLOCK": 1024}, num_warps=8)]
    launch = opgen.jit.kernel(
        K.accumulate_kernel, lambda m: (triton.cdiv(m["n"], m["BLOCK"]),), configs=configs, mutates=["acc_ptr"]
    )
    acc = torch.randn(100_000, device="cuda")
    x = torch.randn(100_000, device="cuda")
    expected = acc + x
    launch(acc, x, 100_000)
    torch.testing.assert_close(acc, expected, rtol=0, atol=0)  # timing ran on copies: one += only
    assert STATS.tunes == 1 and STATS.compiles == 2
    (pick,) = launch.kernel.picks.values()
    assert "autotuned" in pick


CHILD = textwrap.dedent(
    """
    import json, sys, torch, triton
    sys.path.insert(0, {here!r})
    import kernels_for_tests as K
    import opgen.jit
    from opgen.jit import Config
    configs = [Config({{"BLOCK": 128}}), Config({{"BLOCK": 1024}}, num_warps=8)]
    launch = opgen.jit.kernel(K.accumulate_kernel, lambda m: (triton.cdiv(m["n"], m["BLOCK"]),), configs=configs,
                              mutates=["acc_ptr"])
    acc = torch.zeros(50_000, device="cuda")
    x = torch.arange(50_000, device="cuda", dtype=torch.float32)
    launch(acc, x, 50_000)
    ok = bool(torch.equal(acc, x))
    print(json.dumps({{**opgen.jit.stats(), "ok": ok}}))
    """
)


def run_child(cache: Path) -> dict:
    env = {**os.environ, "OPGEN_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(here=str(HERE))], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cache_hit_in_a_fresh_process_and_damaged_entries(fresh_cache):
    first = run_child(fresh_cache)
    assert first["ok"] and first["compiles"] == 2 and first["tunes"] == 1
    second = run_child(fresh_cache)
    assert second["ok"] and second["compiles"] == 0 and second["tunes"] == 0
    assert second["cache_hits"] >= 1 and second["tune_hits"] == 1
    for entry in fresh_cache.rglob("*.bin"):
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2])  # truncated
    for entry in fresh_cache.rglob("*.json"):
        entry.write_text(entry.read_text()[:-3] + "xyz")  # corrupt
    third = run_child(fresh_cache)
    assert third["ok"] and third["rebuilt"] >= 2 and third["compiles"] >= 1
    fourth = run_child(fresh_cache)
    assert fourth["ok"] and fourth["compiles"] == 0 and fourth["rebuilt"] == 0


def test_warmup_compiles_in_the_background():
    launch = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=256)
    x = torch.randn(4096, device="cuda")
    launch.kernel.warmup(x, x, x, 4096, 1.0)
    futures = list(launch.kernel._futures.values())
    assert len(futures) == 1
    futures[0].result(timeout=120)
    assert STATS.compiles == 1
    out = torch.empty_like(x)
    launch(x, x, out, 4096, 1.0)
    assert STATS.compiles == 1  # the first call found the binary ready
    torch.testing.assert_close(out, 2 * x)


def test_launches_are_captured_by_cuda_graphs():
    launch = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=256)
    x = torch.randn(3000, device="cuda")
    y = torch.randn(3000, device="cuda")
    out = torch.empty_like(x)
    launch(x, y, out, 3000, 1.0)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(x, y, out, 3000, 2.0)
    out.zero_()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + 2.0 * y)


def test_runs_on_the_callers_stream():
    launch = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=256)
    x = torch.randn(1 << 20, device="cuda")
    out = torch.empty_like(x)
    launch(x, x, out, x.numel(), 1.0)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            launch(x, x, out, x.numel(), 2.0)
    stream.synchronize()
    torch.testing.assert_close(out, 3 * x)


def test_choice_picks_persist_are_shared_by_identity_and_can_be_forced(fresh_cache):
    from opgen.jit.choice import Choice

    triton_add = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=1024)

    def with_triton(a, b):
        out = torch.empty_like(a)
        triton_add(a, b, out, a.numel(), 1.0)
        return out

    candidates = {"aten": torch.add, "triton": with_triton}
    a = torch.randn(1 << 16, device="cuda")
    b = torch.randn(1 << 16, device="cuda")
    choice = Choice("add", candidates, identity=("test",), fixed_sizes=True)
    torch.testing.assert_close(choice(a, b), a + b)
    ((picked, why),) = choice.picks.values()
    assert picked in candidates and "fastest" in why and STATS.choices == 1
    again = Choice("add", candidates, identity=("test",))
    torch.testing.assert_close(again(a, b), a + b)
    assert STATS.choice_hits == 1 and next(iter(again.picks.values()))[0] == picked
    layer = Choice("add in another layer", candidates, identity=("test",))  # same computation, another name
    torch.testing.assert_close(layer(a, b), a + b)
    assert STATS.choice_hits == 2 and next(iter(layer.picks.values())) == (picked, "pick from the cache")
    other = Choice("add", candidates, identity=("other",))  # another computation times again
    torch.testing.assert_close(other(a, b), a + b)
    assert STATS.choices == 2
    forced = Choice("add", candidates, identity=("test",), force="triton")
    torch.testing.assert_close(forced(a, b), a + b)
    assert next(iter(forced.picks.values())) == ("triton", "forced")
    with pytest.raises(ValueError, match="not a candidate"):
        Choice("add", candidates, force="cuda")


def _host_busy(us):
    import time

    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def test_a_choice_times_gpu_work_not_the_hosts_launch(fresh_cache):
    """A candidate whose launch keeps the host busy 400 us but whose kernel takes a few us beats one whose
    kernel spins about 60 us on the GPU: the spin before each timed call outlasts the host's work."""
    from opgen.jit.choice import Choice
    from opgen.jit.timing import _cycles_per_us

    x = torch.randn(4096, device="cuda")
    cycles = int(60 * _cycles_per_us())

    def slow_host(a):
        _host_busy(400)
        return a + 1

    def slow_gpu(a):
        torch.cuda._sleep(cycles)
        return a + 1

    choice = Choice("add one", {"slow_gpu": slow_gpu, "slow_host": slow_host}, identity=("host test",))
    torch.testing.assert_close(choice(x), x + 1)
    ((picked, why),) = choice.picks.values()
    assert picked == "slow_host", why
    assert "not cached" not in why and STATS.choices == 1
    again = Choice("add one", {"slow_gpu": slow_gpu, "slow_host": slow_host}, identity=("host test",))
    again(x)
    assert next(iter(again.picks.values())) == ("slow_host", "pick from the cache")


def test_a_timing_the_host_cannot_keep_clean_is_not_cached(fresh_cache, monkeypatch):
    from opgen.jit import timing
    from opgen.jit.choice import Choice

    monkeypatch.setattr(timing, "MAX_SPIN_US", 100.0)  # shorter than the host's 400 us per call
    x = torch.randn(4096, device="cuda")

    def slow_host(a):
        _host_busy(400)
        return a + 1

    candidates = {"aten": lambda a: a + 1, "slow_host": slow_host}
    choice = Choice("add one", candidates, identity=("untrusted test",))
    torch.testing.assert_close(choice(x), x + 1)
    ((_, why),) = choice.picks.values()
    assert "too slow for a clean timing, so it is not cached" in why
    again = Choice("add one", candidates, identity=("untrusted test",))
    again(x)
    assert "fastest on the first call" in next(iter(again.picks.values()))[1] and STATS.choice_hits == 0


def test_launch_tells_grid_functions_apart_by_their_closure():
    """Each call makes a new lambda: one over another n gets its own launcher, one over the same n
    reuses the launcher made for it (no launcher, and no binary load, per call)."""

    def grid_for(size):
        return lambda m: (triton.cdiv(size, m["BLOCK"]),)  # `size` is a closure value, baked into the grid

    for n in (100, 5000, 300):
        out = torch.zeros(5000, device="cuda", dtype=torch.int64)
        opgen.jit.launch(K.int_kernel, grid_for(n), out, n, 2, BLOCK=64)
        expected = torch.zeros(5000, dtype=torch.int64)
        expected[:n] = torch.arange(n) * 2
        assert torch.equal(out.cpu(), expected)
    made = len(K.int_kernel._opgen_launchers)
    for _ in range(3):
        opgen.jit.launch(K.int_kernel, grid_for(300), torch.zeros(300, device="cuda", dtype=torch.int64), 300, 2,
                         BLOCK=64)  # fmt: skip
    assert len(K.int_kernel._opgen_launchers) == made


# --- shared memory beyond the device's limit: refused with a clear error, never launched ------------------


def rows_dot(configs):
    x = torch.randn(16, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 1024, device="cuda", dtype=torch.float16) / 32
    out = torch.empty(16, 256, device="cuda")
    launch = opgen.jit.kernel(K.rows_dot_kernel, lambda m: (256 // m["BLOCK_N"],), configs=configs)
    return launch, (x, w, out)


def test_a_config_needing_more_shared_memory_than_the_device_allows_is_refused(monkeypatch):
    launch, args = rows_dot([Config({"K": 1024, "BLOCK_N": 64, "BLOCK_K": 64}, num_stages=3)])
    monkeypatch.setattr(env, "shared_memory_limit", lambda device: -1)
    with pytest.raises(opgen.jit.JitError, match=r"needs \d+ bytes of shared memory, and device 0 allows -1"):
        launch(*args)
    assert launch.variant_count == 0


def test_autotuning_skips_the_configs_that_need_too_much_shared_memory(monkeypatch):
    small = Config({"K": 1024, "BLOCK_N": 64, "BLOCK_K": 32}, num_stages=2)
    big = Config({"K": 1024, "BLOCK_N": 64, "BLOCK_K": 128}, num_stages=4)
    launch, args = rows_dot([big, small])
    launch.kernel.warmup(*args)
    shared = {b.num_stages: b.shared for b in (f.result(timeout=120) for f in launch.kernel._futures.values())}
    assert shared[2] < shared[4]
    monkeypatch.setattr(env, "shared_memory_limit", lambda device: shared[2])
    launch(*args)
    x, w, out = args
    torch.testing.assert_close(out, x.float() @ w.float().T, rtol=1e-2, atol=1e-2)
    (pick,) = launch.kernel.picks.values()
    assert pick.startswith("config 1 ") and "the only config that fits; 1 config(s) skipped" in pick
    monkeypatch.setattr(env, "shared_memory_limit", lambda device: -1)
    again, args = rows_dot([big, small])
    with pytest.raises(opgen.jit.JitError, match="every config needs more shared memory"):
        again(*args)


def test_the_few_row_tile_that_crashed_the_launcher_is_skipped():
    """Six stages of (32, 256) for Llama-3.2-1B's q/k/v at 8 rows need 240 KB on an H200 (227 KB allowed):
    its launch took the process down (a segmentation fault, not an error). Autotuned beside one that fits,
    it is skipped where it does not fit; the kernel runs and matches."""
    import importlib.util

    from opgen.jit.kernels import JitKernel
    from opgen.runtime.codegen.triton import few_rows
    from opgen.runtime.ir import GemvPlan, GemvRows

    k, widths = 2048, (2048, 512, 512)
    plan = GemvPlan(k, 1, tuple(GemvRows(n, k, False) for n in widths), m=8, x_row_stride=k)
    name, source = few_rows.kernel(plan)
    path = Path(os.environ["OPGEN_CACHE_DIR"]).parent / "few_rows_kernel.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("few_rows_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    configs = [Config({"BLOCK_N": 32, "BLOCK_K": 256}, num_warps=4, num_stages=s) for s in (6, 3)]
    kernel = JitKernel(getattr(module, name), (plan.blocks(32),), configs)
    x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 32 for n in widths]
    outs = [torch.empty(8, n, device="cuda", dtype=torch.bfloat16) for n in widths]
    kernel.launcher(x, *ws, *outs)
    for out, w in zip(outs, ws):
        torch.testing.assert_close(out.float(), x.float() @ w.float().T, rtol=2e-2, atol=2e-2)
    shared = max(f.result().shared for f in kernel._futures.values())
    (pick,) = kernel.picks.values()
    assert ("skipped" in pick) == (shared > env.shared_memory_limit(0))


PROBE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    import torch
    import opgen.jit
    from opgen.jit import env
    import kernels_for_tests as K

    launch = opgen.jit.kernel(K.axpy_kernel, ("cdiv(n, BLOCK)",), BLOCK=256)
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    args = (x, x, out, 1024, 1.0)
    launch(*args)
    kernel = launch.kernel
    binary = next(iter(kernel._futures.values())).result()
    native = kernel.native
    scratch = native.JitLauncher("too_big", len(kernel.names), None)
    params = [(p.kind, getattr(torch, p.dtype) if p.dtype else None, p.align16, p.div16) for p in binary.params]
    native.jit_add_variant(scratch, binary.cubin, binary.name, binary.num_warps, env.shared_memory_limit(0) + 1024,
                           params, kernel._grid_for(kernel.configs[0], args), binary.extra_pointers)
    try:
        native.jit_launch_strict(scratch, *args)
    except Exception as exc:
        print("raised", type(exc).__name__, str(exc).splitlines()[0])
    """
)


def test_the_launcher_itself_raises_for_a_variant_beyond_the_shared_memory_limit(fresh_cache):
    """The C++ launcher's own check (behind the Python one): an error in a child process, which lives on. It
    crashed the child (a segmentation fault formatting the message) where the toolchain linked libstdc++
    statically into the extension, beside the shared one torch loads; opgen.cmake links torch's
    (`_opgen_one_cxx_runtime`)."""
    child_env = {**os.environ, "OPGEN_CACHE_DIR": str(fresh_cache)}
    done = subprocess.run([sys.executable, "-c", PROBE.format(here=str(HERE))], env=child_env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "raised" in done.stdout and "bytes of shared memory; the device allows" in done.stdout, done.stdout
