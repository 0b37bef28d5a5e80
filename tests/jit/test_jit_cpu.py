"""What of opgen.jit runs without a GPU: the expression language, compiled-kernel data, the disk
cache (damage detection, concurrent writers), the forced multi-kernel choice, and the clear error
every JIT entry point gives where it cannot run."""

from __future__ import annotations

import threading

import pytest
import torch

import opgen.jit
from opgen.jit import cache, expr
from opgen.jit.binary import KernelBinary, ParamSpec
from opgen.jit.cache import STATS
from opgen.jit.choice import Choice


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OPGEN_FORCE_KERNEL", raising=False)
    STATS.reset()
    return tmp_path


@pytest.mark.parametrize(
    ("text", "args", "value"),
    [
        ("cdiv(n, BLOCK)", [0, 1000], 8),
        ("cdiv(numel(x), 64) * 2 - 1", [torch.empty(3, 65), 0], 7),
        ("size(x, 1) + stride(x, 0) // 5", [torch.empty(3, 65), 0], 78),
        ("max(n, 3) - min(n, -2) + -n", [0, 5], 2),
        ("-7 // 2", [0, 0], -4),
        (12, [0, 0], 12),
    ],
)
def test_expressions_compile_to_programs(text, args, value):
    program = expr.to_program(expr.parse(text), {"x": 0, "n": 1}, {"BLOCK": 128})
    assert all(isinstance(op, int) for op in program)
    assert expr.evaluate(program, args) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("foo(n)", "is not allowed"),
        ("n / 2", "is not allowed"),
        ("numel(2)", "needs a tensor's name"),
        ("size(x, d)", "literal int dimension"),
        ("cdiv(n)", "takes 2 argument"),
        ("n +", "cannot parse"),
        ("1.5", "is not allowed"),
    ],
)
def test_expression_errors_say_what_is_wrong(text, message):
    with pytest.raises(expr.ExprError, match=message):
        expr.parse(text)


def test_programs_name_unknown_names():
    with pytest.raises(expr.ExprError, match="unknown name 'm'"):
        expr.to_program(expr.parse("m + 1"), {"n": 0}, {})
    with pytest.raises(expr.ExprError, match="not a tensor parameter"):
        expr.to_program(expr.parse("numel(y)"), {"n": 0}, {})


def test_grid_functions_trace_to_expressions_or_say_they_cannot():
    x = torch.empty(10, 30)
    traced = expr.trace_grid(lambda m: ((m["n"] + m["BLOCK"] - 1) // m["BLOCK"], m["x"].shape[1]),
                             {"x": x, "n": 300}, {"BLOCK": 64})  # fmt: skip
    assert traced is not None
    values = [expr.evaluate(expr.to_program(e, {"x": 0, "n": 1}, {}), [x, 300]) for e in traced]
    assert values == [5, 30]
    assert expr.trace_grid(lambda m: (max(m["n"], 1),), {"n": 3}, {}) is None  # compares a traced value
    assert expr.trace_grid(lambda m: (m["n"] * 0.5,), {"n": 3}, {}) is None  # floats
    assert expr.trace_grid(lambda m: (1, 2, 3, 4), {}, {}) is None  # four dimensions


def binary(key: str = "k" * 64) -> KernelBinary:
    params = (ParamSpec("x", "ptr", "float32", True), ParamSpec("n", "i32", div16=True), ParamSpec("a", "const_one"))
    return KernelBinary(key, "add_kernel", b"\x7fELF" + bytes(range(256)) * 4, 4, 3, 0, 2, params, (("B", 8),), "90")


def test_compiled_kernels_round_trip_and_refuse_damage():
    b = binary()
    data = b.to_bytes()
    assert KernelBinary.from_bytes(data, b.key) == b
    with pytest.raises(ValueError, match="checksum"):
        KernelBinary.from_bytes(data[:-10], b.key)
    with pytest.raises(ValueError, match="another kernel"):
        KernelBinary.from_bytes(data, "x" * 64)
    with pytest.raises(ValueError, match="not an opgen JIT binary"):
        KernelBinary.from_bytes(b"garbage", b.key)


def test_cache_detects_and_counts_damaged_entries(fresh_cache):
    b = binary()
    cache.store_binary(b)
    assert cache.load_binary(b.key) == b and STATS.cache_hits == 1
    (path,) = fresh_cache.rglob("*.bin")
    path.write_bytes(path.read_bytes()[:100])
    assert cache.load_binary(b.key) is None and STATS.rebuilt == 1
    cache.store_pick("p" * 64, {"index": 1})
    assert cache.load_pick("p" * 64)["index"] == 1
    (pick,) = fresh_cache.rglob("*.json")
    pick.write_text(pick.read_text().replace('"index": 1', '"index": 0'))
    assert cache.load_pick("p" * 64) is None and STATS.rebuilt == 2
    assert cache.load_pick("q" * 64) is None and STATS.rebuilt == 2  # absent is not damaged


def test_concurrent_writers_never_leave_a_torn_entry(fresh_cache):
    entries = [binary() for _ in range(8)]
    threads = [threading.Thread(target=lambda b=b: [cache.store_binary(b) for _ in range(20)]) for b in entries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.load_binary(entries[0].key) == entries[0]
    assert not list(fresh_cache.rglob("*.tmp"))


def test_a_forced_choice_runs_the_named_candidate_without_benchmarking():
    calls = []
    candidates = {"a": lambda x: calls.append("a") or x + 1, "b": lambda x: calls.append("b") or x + 1}
    choice = Choice("inc", candidates, force="b", fixed_sizes=True)
    assert choice(torch.ones(2)).tolist() == [2.0, 2.0]
    assert choice(torch.ones(2)).tolist() == [2.0, 2.0]
    assert calls == ["b", "b"] and STATS.choices == 0
    assert "b (forced)" in choice.describe()
    with pytest.raises(ValueError, match="not a candidate"):
        Choice("inc", candidates, force="c")


def test_a_choice_passes_keyword_arguments_to_its_candidates():
    """A kernel's keyword-only arguments (`alpha=2.5`, as generated code passes them) reach the pick as
    keywords, and join the size key: another value is another pick."""
    seen = []

    def candidate(name):
        def call(x, *, alpha=1.0):
            seen.append((name, alpha))
            return x * alpha

        return call

    choice = Choice("scaled", {"a": candidate("a"), "b": candidate("b")}, force="b")
    assert choice(torch.ones(2), alpha=2.5).tolist() == [2.5, 2.5]
    assert choice(torch.ones(2), alpha=2.5).tolist() == [2.5, 2.5]
    assert choice(torch.ones(2)).tolist() == [1.0, 1.0]
    assert seen == [("b", 2.5), ("b", 2.5), ("b", 1.0)] and len(choice.picks) == 2


def test_a_pick_key_tells_aligned_tensors_from_misaligned_views():
    """A Triton binary specializes on 16-byte alignment, so a pick timed on a view one element in is not
    reused for an aligned tensor of the same sizes and strides."""
    from opgen.jit.autotune import size_key

    base = torch.zeros(2 * 2048 + 1, dtype=torch.bfloat16)
    aligned, shifted = base[:2048].view(1, 2048), base[1:2049].view(1, 2048)
    assert aligned.stride() == shifted.stride() and aligned.shape == shifted.shape
    assert size_key([aligned]) != size_key([shifted])
    assert size_key([aligned, 3]) == size_key([base[8:2056].view(1, 2048), 3])  # 16 bytes in: aligned again


@pytest.mark.skipif(opgen.jit.available(), reason="the JIT can run here")
def test_jit_entry_points_say_what_is_missing():
    assert opgen.jit.missing()
    with pytest.raises(opgen.jit.JitUnavailableError, match=r"opgen\.jit cannot run Triton kernels here"):
        opgen.jit.kernel(object(), (1,))
    with pytest.raises(opgen.jit.JitUnavailableError):
        opgen.jit.launch(type("F", (), {})(), (1,))


def test_fixed_grid_launchers_map_each_config_to_its_grid(monkeypatch):
    """Graph kernels and fused kernels build launchers through one helper: each config's fixed grid is
    found from the meta-parameters alone, and examples that cannot be made leave it to the first call."""
    from opgen.jit import graph

    made = {}

    class Recorded:
        def __init__(self, fn, grid, configs, mutates, name, dependent_launch):
            made.update(fn=fn, grid=grid, configs=configs, mutates=mutates, name=name, dependent=dependent_launch)
            self.launcher = f"launcher of {name}"

        def warmup(self, *args):
            made["warmup"] = args

    def no_examples():
        raise RuntimeError("no CUDA device here")

    monkeypatch.setattr(graph, "JitKernel", Recorded)
    configs = (((("BLOCK", 256),), 2, 1, (16, 1, 1)), ((("BLOCK", 1024),), 4, 1, (4, 1, 1)))
    launcher = graph.fixed_grid_launcher("fn", configs, ("x", "out"), ["out"], "fused0_add_relu", no_examples)
    assert launcher == "launcher of fused0_add_relu" and "warmup" not in made
    assert made["grid"]({"x": object(), "out": object(), "BLOCK": 1024}) == (4, 1, 1)
    assert made["grid"]({"x": object(), "out": object(), "BLOCK": 256}) == (16, 1, 1)
    assert [(c.meta, c.num_warps) for c in made["configs"]] == [({"BLOCK": 256}, 2), ({"BLOCK": 1024}, 4)]
    assert made["mutates"] == ["out"] and made["dependent"] is False  # launched plainly unless asked


def test_one_binary_is_one_compile_job_per_process_and_cache_folder(tmp_path, monkeypatch):
    """A model's layers each bind a launcher of the same fused kernel, and all of them submit it before
    the first compile reaches the disk cache: they must share that one job."""
    from opgen.jit import compiler

    started, release = [], threading.Event()

    def slow_compile(fn, spec, options, device):  # type: ignore[no-untyped-def]
        started.append(fn)
        release.wait(timeout=30)
        if fn == "broken":
            raise RuntimeError("does not compile")
        return f"binary of {fn}"

    monkeypatch.setattr(compiler, "load_or_compile", slow_compile)
    monkeypatch.setattr(compiler, "binary_key", lambda fn, spec, options, device: f"key of {fn}")
    monkeypatch.setattr(compiler, "_worker_file", lambda fn: None)
    layers = [compiler.submit("fused0", None, compiler.Options(), 0) for _ in range(12)]
    other = compiler.submit("fused1", None, compiler.Options(), 0)
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "elsewhere"))
    elsewhere = compiler.submit("fused0", None, compiler.Options(), 0)  # another store: its own job
    broken = compiler.submit("broken", None, compiler.Options(), 0)
    release.set()
    assert all(f is layers[0] for f in layers) and layers[0].result() == "binary of fused0"
    assert other.result() == "binary of fused1" and elsewhere is not layers[0] and elsewhere.result()
    with pytest.raises(RuntimeError):
        broken.result()
    again = compiler.submit("broken", None, compiler.Options(), 0)  # a failed job is tried again
    assert again is not broken
    with pytest.raises(RuntimeError):
        again.result()
    assert sorted(started) == ["broken", "broken", "fused0", "fused0", "fused1"]
