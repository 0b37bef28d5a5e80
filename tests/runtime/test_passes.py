"""Each IR pass alone, on programs built by hand (no graph, no export)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from opgen import kernel_ops
from opgen.runtime.artifact.compiled import compiled_graph
from opgen.runtime.codegen.python import emit
from opgen.runtime.execution import executor
from opgen.runtime.ir import (
    Alloc,
    Free,
    Input,
    KernelCall,
    Program,
    Ref,
    Return,
    SizeExpr,
    Sym,
    TensorConstant,
    TensorMeta,
    Value,
    View,
    contiguous_strides,
)
from opgen.runtime.passes import PASSES, run_passes
from opgen.runtime.passes.analysis import Groups
from opgen.runtime.passes.constants import fold_constants
from opgen.runtime.passes.conv_bn import fold_conv_bn
from opgen.runtime.passes.dead_code import eliminate_dead_code
from opgen.runtime.passes.layout import channels_last_pooling
from opgen.runtime.passes.memory import insert_frees, plan_memory
from opgen.runtime.passes.mkl_linear import MAX_ROWS, MIN_ROWS, pack_linear_mkl
from opgen.runtime.passes.prepack import MIN_MACS, MIN_WEIGHT, prepack_linear
from opgen.runtime.passes.shapes import fold_shapes
from opgen.runtime.passes.views import drop_identity_views, hoist_views, sink_reshapes


def meta(*shape: int, dtype: str = "float32") -> TensorMeta:
    return TensorMeta(shape, contiguous_strides(shape), dtype, "cpu")


def call(
    kernel: str,
    *args: object,
    out: str | None = None,
    shape: tuple[int, ...] = (),
    pointwise: bool = False,
    **kwargs: object,
) -> KernelCall:
    outputs = (Value(out, meta(*shape)),) if out else ()
    return KernelCall(
        kernel, tuple(args), tuple(kwargs.items()), outputs, out or kernel, f"aten.{kernel}", pointwise=pointwise
    )


def program(
    *body: object, inputs: tuple[Input, ...] = (), constants: tuple[TensorConstant, ...] = (), setup: tuple = ()
) -> Program:
    return Program("forward", inputs, constants, tuple(setup), tuple(body))


def kernels(lines: tuple) -> list[str]:
    return [line.kernel for line in lines if isinstance(line, KernelCall)]


X, Y = Input("x", meta(16)), Input("y", meta(16))


def test_dead_code_drops_unused_calls_results_and_constants(registry) -> None:
    w = TensorConstant("w", "w", meta(4))
    p = program(
        call("relu", Ref("x"), out="buf0", shape=(16,)),
        KernelCall(
            "max_dim",
            (Ref("x"), 0),
            (),
            (Value("buf1", meta()), Value("buf2", meta())),
            "max",
            "aten.max.dim",
            unpack=True,
        ),
        call("neg", Ref("buf1"), out="buf3", shape=()),
        Return((Ref("buf3"),), "single"),
        inputs=(X,),
        constants=(w,),
    )
    out = eliminate_dead_code(p, registry)
    assert kernels(out.body) == ["max_dim", "neg"]
    assert out.body[0].outputs == (Value("buf1", meta()), None)
    assert out.constants == ()


def test_identity_views_become_the_source(registry) -> None:
    p = program(
        call("alias", Ref("x"), out="buf0", shape=(16,)),
        call("view", Ref("buf0"), (16,), out="buf1", shape=(16,)),
        call("view", Ref("buf1"), (4, 4), out="buf2", shape=(4, 4)),
        Return((Ref("buf2"),), "single"),
        inputs=(X,),
    )
    out = drop_identity_views(p, registry)
    assert out.body == (call("view", Ref("x"), (4, 4), out="buf2", shape=(4, 4)), Return((Ref("buf2"),), "single"))


def test_sink_reshapes_turns_reshape_add_into_one_add(registry) -> None:
    p = program(
        call("view", Ref("x"), (4, 4), out="buf0", shape=(4, 4)),
        call("view", Ref("y"), (4, 4), out="buf1", shape=(4, 4)),
        call("add", Ref("buf0"), Ref("buf1"), out="buf2", shape=(4, 4), pointwise=True),
        call("view", Ref("buf2"), (16,), out="buf3", shape=(16,)),
        Return((Ref("buf3"),), "single"),
        inputs=(X, Y),
    )
    out = eliminate_dead_code(sink_reshapes(p, registry), registry)
    assert out.body == (
        call("add", Ref("x"), Ref("y"), out="buf2", shape=(16,), pointwise=True),
        Return((Ref("buf2"),), "single"),
    )


def test_sink_reshapes_leaves_broadcasting_ops_alone(registry) -> None:
    p = program(
        call("view", Ref("x"), (4, 4), out="buf0", shape=(4, 4)),
        call("view", Ref("z"), (1, 4), out="buf1", shape=(1, 4)),
        call("add", Ref("buf0"), Ref("buf1"), out="buf2", shape=(4, 4), pointwise=True),
        call("view", Ref("buf2"), (16,), out="buf3", shape=(16,)),
        Return((Ref("buf3"),), "single"),
        inputs=(X, Input("z", meta(4))),
    )
    assert sink_reshapes(p, registry) == p


def test_hoist_views_moves_views_of_constants_into_setup(registry) -> None:
    w = TensorConstant("w", "w", meta(4, 8))
    p = program(
        call("permute", Ref("w"), (1, 0), out="buf0", shape=(8, 4)),
        call("mm", Ref("x2"), Ref("buf0"), out="buf1", shape=(2, 4)),
        Return((Ref("buf1"),), "single"),
        inputs=(Input("x2", meta(2, 8)),),
        constants=(w,),
    )
    out = hoist_views(p, registry)
    assert kernels(out.setup) == ["permute"] and kernels(out.body) == ["mm"]


def test_constant_folding_hoists_constant_only_calls_but_not_outputs(registry) -> None:
    mask = TensorConstant("mask", "mask", meta(4, dtype="bool"))
    p = program(
        call("bitwise_not", Ref("mask"), out="buf0", shape=(4,)),
        call("scalar_tensor", Sym("float", "-inf"), out="buf1", shape=()),
        call("where", Ref("buf0"), Ref("buf1"), Ref("x4"), out="buf2", shape=(4,)),
        call("neg", Ref("mask"), out="buf3", shape=(4,)),
        Return((Ref("buf2"), Ref("buf3")), "tuple"),
        inputs=(Input("x4", meta(4)),),
        constants=(mask,),
    )
    out = fold_constants(p, registry)
    assert kernels(out.setup) == ["bitwise_not", "scalar_tensor"]
    assert kernels(out.body) == ["where", "neg"]  # neg(mask) is returned: it stays a fresh result


def test_constant_folding_keeps_buffers_the_body_writes(registry) -> None:
    """A buffer made from constants alone but written on every call (by a Triton kernel, say) is no
    constant: neither it nor what reads it moves into setup."""
    write = KernelCall("jit_k", (Ref("x4"), Ref("buf1")), (), (), "k", "triton:k", mutates=("buf1",), jit=True)
    p = program(
        call("zeros", (4,), out="buf0", shape=(4,)),
        call("clone", Ref("buf0"), out="buf1", shape=(4,)),
        write,
        call("relu", Ref("buf1"), out="buf2", shape=(4,)),
        call("neg", Ref("buf2"), out="buf3", shape=(4,)),
        Return((Ref("buf3"),), "single"),
        inputs=(Input("x4", meta(4)),),
    )
    out = fold_constants(p, registry)
    assert kernels(out.setup) == ["zeros"]
    assert kernels(out.body) == ["clone", "jit_k", "relu", "neg"]


def test_shape_folding_folds_size_queries_and_resolves_minus_one(registry) -> None:
    size = KernelCall(
        "aten.sym_size.int", (Ref("x"), 0), (), (Value("s0"),), "sym_size", "aten.sym_size.int", fallback=True
    )
    times = KernelCall("py:_operator.mul", (Ref("s0"), 2), (), (Value("s1"),), "mul", "py:_operator.mul", fallback=True)
    p = program(
        size,
        times,
        call("view", Ref("x"), (Ref("s1"), -1), out="buf0", shape=(32, 1)),
        call("view", Ref("x"), (4, -1), out="buf1", shape=(4, 4)),
        Return((Ref("buf0"), Ref("buf1")), "tuple"),
        inputs=(X,),
    )
    out = fold_shapes(p, registry)
    assert out.body[:2] == (
        call("view", Ref("x"), (32, 1), out="buf0", shape=(32, 1)),
        call("view", Ref("x"), (4, 4), out="buf1", shape=(4, 4)),
    )


def conv_bn_program(bias: bool) -> Program:
    c = [
        TensorConstant(n, n, m)
        for n, m in (("w", meta(8, 3, 3, 3)), ("g", meta(8)), ("b", meta(8)), ("m", meta(8)), ("v", meta(8)))
    ]
    if bias:
        c.append(TensorConstant("cb", "cb", meta(8)))
    conv = call(
        "convolution",
        Ref("img"),
        Ref("w"),
        Ref("cb") if bias else None,
        (1, 1),
        (1, 1),
        (1, 1),
        False,
        (0, 0),
        1,
        out="buf0",
        shape=(1, 8, 6, 6),
    )
    bn = KernelCall(
        "_native_batch_norm_legit_no_training",
        (Ref("buf0"), Ref("g"), Ref("b"), Ref("m"), Ref("v"), 0.1, 1e-5),
        (),
        (Value("buf1", meta(1, 8, 6, 6)), None, None),
        "bn",
        "aten._native_batch_norm_legit_no_training.default",
        unpack=True,
    )
    return program(
        conv, bn, Return((Ref("buf1"),), "single"), inputs=(Input("img", meta(1, 3, 6, 6)),), constants=tuple(c)
    )


@pytest.mark.parametrize("bias", [False, True])
def test_conv_bn_folding_rewrites_and_computes_the_same(registry, bias: bool) -> None:
    p = conv_bn_program(bias)
    out = fold_conv_bn(p, registry)
    assert kernels(out.body) == ["convolution"] and out.body[0].outputs[0].name == "buf1"
    assert "rsqrt" in kernels(out.setup)
    torch.manual_seed(0)
    values = {c.key: torch.randn(c.meta.shape) for c in p.constants}
    values["v"] = values["v"].abs() + 0.5
    img = torch.randn(1, 3, 6, 6)
    graph = compiled_graph("k" * 64, out, emit(out))
    fn = executor.bind(graph, values, executor.Runtime(lambda *a: None), kernel_ops)
    conv = torch.nn.functional.conv2d(img, values["w"], values.get("cb"), 1, 1)
    ref = torch.nn.functional.batch_norm(conv, values["m"], values["v"], values["g"], values["b"], False, 0.1, 1e-5)
    torch.testing.assert_close(fn(img), ref, atol=1e-5, rtol=1e-5)


def linear_program(rows: int | SizeExpr, features: tuple[int, int] = (256, 512)) -> Program:
    """`addmm(b, xs, w.T)`: `rows` x in x out; by default a weight of MIN_WEIGHT elements, which prepack packs."""
    n_in, n_out = features
    product = KernelCall(
        "addmm", (Ref("b"), Ref("xs"), Ref("buf0")), (),
        (Value("buf1", TensorMeta((rows, n_out), (n_out, 1), "float32", "cpu")),), "buf1", "aten.addmm",
    )  # fmt: skip
    return program(
        call("permute", Ref("w"), (1, 0), out="buf0", shape=(n_in, n_out)),
        product,
        Return((Ref("buf1"),), "single"),
        inputs=(Input("xs", TensorMeta((rows, n_in), (n_in, 1), "float32", "cpu")),),
        constants=(TensorConstant("w", "w", meta(n_out, n_in)), TensorConstant("b", "b", meta(n_out))),
    )


def runtime_weight_program() -> Program:
    """`linear_program(16)` with the weight an input: nothing to pack once."""
    return replace(
        linear_program(16),
        constants=(TensorConstant("b", "b", meta(512)),),
        inputs=(Input("xs", meta(16, 256)), Input("w", meta(512, 256))),
    )


def run_linear(out: Program, rows: int, features: tuple[int, int] = (256, 512)) -> None:
    """Bind `out` (a rewritten `linear_program`) and check it against `F.linear`."""
    n_in, n_out = features
    values = {"w": torch.randn(n_out, n_in), "b": torch.randn(n_out)}
    xs = torch.randn(rows, n_in)
    fn = executor.bind(compiled_graph("p" * 64, out, emit(out)), values, executor.Runtime(lambda *a: None), kernel_ops)
    torch.testing.assert_close(fn(xs), torch.nn.functional.linear(xs, values["w"], values["b"]), atol=1e-4, rtol=1e-4)


def test_prepack_runs_linear_layers_through_onednn_with_packed_weights(registry) -> None:
    p = fold_constants(linear_program(16), registry)
    out = eliminate_dead_code(prepack_linear(p, registry), registry)
    assert [line.kernel for line in out.setup] == ["mkldnn._reorder_linear_weight.default"]
    assert out.body[0].kernel == "mkldnn_linear_pointwise" and out.body[0].args[1:3] == (
        Ref("packed0"),
        Ref("b"),
    )
    run_linear(out, 16)


@pytest.mark.parametrize(
    ("rows", "features", "packed"),
    [
        (32, (128, 128), False),  # 2^19 multiply-adds, a 2^14-element weight: addmm is 1.5x faster
        (128, (128, 128), False),  # 2^21
        (256, (128, 128), True),  # MIN_MACS (2^22) with a small weight
        (16, (256, 256), False),  # 2^20, a 2^16-element weight
        (8, (256, 512), True),  # 2^20, but a weight of MIN_WEIGHT (2^17) elements
    ],
)
def test_prepack_packs_only_large_linear_layers(registry, rows, features, packed) -> None:
    assert 1 << 22 == MIN_MACS and 1 << 17 == MIN_WEIGHT  # the sizes above sit on these thresholds
    p = fold_constants(linear_program(rows, features), registry)
    out = eliminate_dead_code(prepack_linear(p, registry), registry)
    assert (out.body[0].kernel == "mkldnn_linear_pointwise") == packed
    assert (out == eliminate_dead_code(p, registry)) == (not packed)
    run_linear(out, rows, features)


def test_prepack_takes_symbolic_rows_at_their_upper_bound(registry) -> None:
    p = fold_constants(linear_program(SizeExpr("s0", ("s0",)), (128, 128)), registry)
    assert prepack_linear(replace(p, ranges=(("s0", 8, 64),)), registry) == replace(p, ranges=(("s0", 8, 64),))
    big = prepack_linear(replace(p, ranges=(("s0", 8, 256),)), registry)  # 256 x 128 x 128 = MIN_MACS
    unbounded = prepack_linear(replace(p, ranges=(("s0", 8, None),)), registry)  # unknown: taken as large
    assert "mkldnn._reorder_linear_weight.default" in kernels(big.setup)
    assert kernels(unbounded.setup) == kernels(big.setup)


needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")


@needs_mkl
@pytest.mark.parametrize(("rows", "features"), [(MIN_ROWS, (256, 512)), (16, (128, 128)), (MAX_ROWS - 1, (64, 32))])
def test_mkl_linear_packs_static_rows_from_min_rows_below_max_rows(registry, rows, features) -> None:
    p = fold_constants(linear_program(rows, features), registry)
    out = eliminate_dead_code(pack_linear_mkl(p, registry), registry)
    assert kernels(out.setup) == ["mkl._mkl_reorder_linear_weight.default"] and out.setup[0].args[1] == rows
    assert out.body[0].kernel == "mkl_linear"
    assert out.body[0].args[1:] == (Ref("mkl_packed0"), Ref("w"), Ref("b"), rows)
    run_linear(out, rows, features)


@needs_mkl
def test_mkl_linear_leaves_few_many_or_symbolic_rows_and_runtime_weights_to_prepack(registry) -> None:
    few = fold_constants(linear_program(MIN_ROWS - 1), registry)
    assert pack_linear_mkl(few, registry) == few
    many = fold_constants(linear_program(MAX_ROWS), registry)
    assert pack_linear_mkl(many, registry) == many
    assert kernels(prepack_linear(many, registry).body) == ["mkldnn_linear_pointwise"]  # oneDNN's from here
    symbolic = replace(fold_constants(linear_program(SizeExpr("s0", ("s0",))), registry), ranges=(("s0", 2, 16),))
    assert pack_linear_mkl(symbolic, registry) == symbolic
    weight_as_input = runtime_weight_program()
    assert pack_linear_mkl(weight_as_input, registry) == weight_as_input


@needs_mkl
def test_mkl_linear_packs_a_weight_once_per_row_count_and_keeps_activations(registry) -> None:
    """Two products on one weight share its packing; gelu stays its own call (MKL has no post-ops)."""
    first = linear_program(16).body[1]
    assert isinstance(first, KernelCall)
    second = replace(first, args=(Ref("b"), Ref("buf2"), Ref("buf0")), outputs=(Value("buf3", meta(16, 512)),))
    p = replace(
        linear_program(16, (512, 512)),
        body=(
            *linear_program(16, (512, 512)).body[:2],
            call("gelu", Ref("buf1"), out="buf2", shape=(16, 512)),
            second,
            Return((Ref("buf3"),), "single"),
        ),
    )
    out = eliminate_dead_code(pack_linear_mkl(fold_constants(p, registry), registry), registry)
    assert kernels(out.setup) == ["mkl._mkl_reorder_linear_weight.default"]
    assert kernels(out.body) == ["mkl_linear", "gelu", "mkl_linear"]
    values = {"w": torch.randn(512, 512), "b": torch.randn(512)}
    xs = torch.randn(16, 512)
    fn = executor.bind(compiled_graph("m" * 64, out, emit(out)), values, executor.Runtime(lambda *a: None), kernel_ops)
    linear = lambda x: torch.nn.functional.linear(x, values["w"], values["b"])  # noqa: E731
    torch.testing.assert_close(fn(xs), linear(torch.nn.functional.gelu(linear(xs))), atol=1e-4, rtol=1e-4)


def test_prepack_leaves_single_rows_and_runtime_weights_alone(registry) -> None:
    single = fold_constants(linear_program(1), registry)
    assert prepack_linear(single, registry) == single
    weight_as_input = runtime_weight_program()
    assert prepack_linear(weight_as_input, registry) == weight_as_input


def test_layout_pools_in_channels_last(registry) -> None:
    pool = KernelCall(
        "max_pool2d_with_indices", (Ref("img"), (3, 3), (2, 2), (1, 1)), (),
        (Value("buf0", meta(1, 16, 4, 4)), None), "pool", "aten.max_pool2d_with_indices.default", unpack=True,
    )  # fmt: skip
    p = program(pool, Return((Ref("buf0"),), "single"), inputs=(Input("img", meta(1, 16, 8, 8)),))
    out = channels_last_pooling(p, registry)
    assert kernels(out.body) == ["clone", "max_pool2d_with_indices", "clone"]
    assert out.body[0].kwargs == (("memory_format", Sym("memory_format", "channels_last")),)
    assert out.body[1].outputs[0].meta.stride == (256, 1, 64, 16)
    assert out.body[2].outputs[0].name == "buf0" and out.body[2].outputs[0].meta == meta(1, 16, 4, 4)


def test_memory_planning_in_place_out_variants_and_fresh_outputs(registry) -> None:
    p = program(
        call("exp", Ref("x"), out="buf0", shape=(16,)),  # an intermediate: out= into a persistent slot
        call("relu", Ref("buf0"), out="buf1", shape=(16,)),  # buf0 dies here: relu_ in place
        call("mul", Ref("x"), Ref("buf1"), out="buf2", shape=(16,)),  # buf1 dies: mul_ with operands swapped
        call("sin", Ref("x"), out="buf3", shape=(16,)),  # x is an input: never written
        call("add", Ref("buf2"), Ref("buf3"), out="buf4", shape=(16,)),  # returned: a fresh tensor, not a slot
        Return((Ref("buf4"),), "single"),
        inputs=(X,),
    )
    out = plan_memory(p, registry)
    assert kernels(out.body) == ["exp_out", "relu_", "mul_", "sin_out", "add"]
    assert out.body[2].args == (Ref("buf0"), Ref("x")) and out.body[4].args == (Ref("buf0"), Ref("buf3"))
    assert out.body[-1] == Return((Ref("buf4"),), "single")
    assert [type(line) for line in out.setup] == [Alloc, Alloc, View, View]


def test_memory_planning_writes_in_place_into_per_call_values_that_are_returned(registry) -> None:
    p = program(
        call(
            "convolution",
            Ref("img"),
            Ref("w"),
            None,
            (1, 1),
            (0, 0),
            (1, 1),
            False,
            (0, 0),
            1,
            out="buf0",
            shape=(1, 4, 2, 2),
        ),
        call("relu", Ref("buf0"), out="buf1", shape=(1, 4, 2, 2)),
        Return((Ref("buf1"),), "single"),
        inputs=(Input("img", meta(1, 4, 2, 2)),),
        constants=(TensorConstant("w", "w", meta(4, 4, 1, 1)),),
    )
    out = plan_memory(p, registry)  # convolution.out copies (copies_into_out): a fresh tensor each call
    assert kernels(out.body) == ["convolution", "relu_"] and out.body[-1] == Return((Ref("buf0"),), "single")
    assert out.setup == ()


def test_memory_planning_reuses_dead_slots_and_never_plans_outputs(registry) -> None:
    p = program(
        call("sin", Ref("x"), out="buf0", shape=(16,)),
        call("cos", Ref("x"), out="buf1", shape=(16,)),
        call("mul", Ref("buf0"), Ref("buf1"), out="buf2", shape=(16,)),
        call("tanh", Ref("x"), out="buf3", shape=(16,)),
        call("sub", Ref("buf2"), Ref("buf3"), out="buf4", shape=(16,)),
        Return((Ref("buf4"),), "single"),
        inputs=(X,),
    )
    out = plan_memory(p, registry)
    allocs = [line for line in out.setup if isinstance(line, Alloc)]
    views = {line.value.name: line.source for line in out.setup if isinstance(line, View)}
    assert kernels(out.body) == ["sin_out", "cos_out", "mul_", "tanh_out", "sub"]
    assert views == {"buf0": "slot0", "buf1": "slot1", "buf3": "slot1"}  # buf1 is dead after mul: tanh reuses its slot
    assert len(allocs) == 2
    assert out.body[-1] == Return((Ref("buf4"),), "single") and "buf4" not in views


def test_frees_follow_last_use_for_big_values(registry) -> None:
    big = Input("big", meta(256, 256))
    p = program(
        call("exp", Ref("big"), out="buf0", shape=(256, 256)),
        call("sum", Ref("buf0"), out="buf1", shape=()),
        call("neg", Ref("buf1"), out="buf2", shape=()),
        Return((Ref("buf2"),), "single"),
        inputs=(big,),
    )
    out = insert_frees(p, registry)
    assert out.body[2] == Free(("buf0",)) and len(out.body) == 5


def test_every_pass_is_registered_and_the_pipeline_runs_on_hand_built_ir(registry) -> None:
    expected = {
        "pads",
        "conv_bn",
        "onednn",
        "layout",
        "cudnn",
        "identity_views",
        "sink_reshapes",
        "shapes",
        "empty_cat",
        "outer_products",
        "reinplace",
        "constants",
        "mkl_linear",
        "prepack",
        "dead_code",
        "collectives",
        "one_shot_all_reduce",
        "peer_sum",
        "peer_gather",
        "decode_attention",
        "grouped_attention",
        "attention_masks",
        "sink_updates",
        "cache_writes",
        "transpose_weights",
        "split_products",
        "gemv",
        "split_bias",
        "casts",
        "lift_views",
        "fusion",
        "spatial_mean",
        "gemv_prologue",
        "gemv_epilogue",
        "horizontal",
        "attention_writes",
        "attention_prologue",
        "attention_rows",
        "dependent_launch",
        "memory",
        "hoist_views",
        "memo",
        "sizes",
        "frees",
        "kernel_choice",
    }
    assert set(PASSES) == expected
    out = run_passes(conv_bn_program(True), registry)
    assert kernels(out.body) == ["convolution"]  # batch norm folded; too small a convolution for oneDNN
    with pytest.raises(ValueError, match="unknown opgen pass 'nope'"):
        run_passes(conv_bn_program(True), registry, ["nope"])


def test_programs_are_plain_frozen_data() -> None:
    p = conv_bn_program(False)
    with pytest.raises(AttributeError):
        p.body = ()  # type: ignore[misc]
    assert replace(p, name="other").name == "other" and p.name == "forward"


def test_in_place_never_writes_an_operand_another_argument_views(registry) -> None:
    p = program(
        call("exp", Ref("sq"), out="buf0", shape=(4, 4)),
        call("permute", Ref("buf0"), (1, 0), out="buf1", shape=(4, 4)),
        call("add", Ref("buf0"), Ref("buf1"), out="buf2", shape=(4, 4), pointwise=True),
        call("neg", Ref("buf2"), out="buf3", shape=(4, 4)),
        Return((Ref("buf3"),), "single"),
        inputs=(Input("sq", meta(4, 4)),),
    )
    out = plan_memory(p, registry)
    assert kernels(out.body) == ["exp_out", "permute", "add_out", "neg"]  # not add_(buf0, buf0.T)


def test_meta_contiguity_ignores_unit_dims() -> None:
    assert TensorMeta((4, 1, 3), (3, 99, 1), "float32", "cpu").is_contiguous()
    assert not TensorMeta((4, 3), (1, 4), "float32", "cpu").is_contiguous()


def test_prepack_fuses_a_following_gelu(registry) -> None:
    p = replace(
        linear_program(16),
        body=(
            *linear_program(16).body[:2],
            call("gelu", Ref("buf1"), out="buf2", shape=(16, 512), approximate="tanh"),
            Return((Ref("buf2"),), "single"),
        ),
    )
    out = eliminate_dead_code(prepack_linear(fold_constants(p, registry), registry), registry)
    assert [line.kernel for line in out.body[:-1]] == ["mkldnn_linear_pointwise"]
    assert out.body[0].args[3:] == ("gelu", (), "tanh") and out.body[0].outputs[0].name == "buf2"
    values = {"w": torch.randn(512, 256), "b": torch.randn(512)}
    xs = torch.randn(16, 256)
    fn = executor.bind(compiled_graph("g" * 64, out, emit(out)), values, executor.Runtime(lambda *a: None), kernel_ops)
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(xs, values["w"], values["b"]), approximate="tanh")
    torch.testing.assert_close(fn(xs), expected, atol=1e-4, rtol=1e-4)


def cuda_meta(*shape: int, stride: tuple[int, ...] | None = None) -> TensorMeta:
    return TensorMeta(shape, stride or contiguous_strides(shape), "float32", "cuda:0")


@pytest.mark.parametrize(
    ("a", "b", "chosen"),
    [
        (cuda_meta(4, 8), cuda_meta(4, 8), True),
        (cuda_meta(4, 8), cuda_meta(8), False),  # broadcasting: the Triton add wants one shape
        (cuda_meta(4, 8, stride=(1, 4)), cuda_meta(4, 8), False),  # not contiguous
        (meta(4, 8), meta(4, 8), False),  # CPU
    ],
)
def test_kernel_choice_offers_fitting_triton_candidates(registry, a, b, chosen) -> None:
    from opgen.runtime.passes.kernel_choice import choose_kernels

    if not registry.candidates("aten::add.Tensor"):
        pytest.skip("this build's spec has no candidate for aten.add.Tensor")
    add = KernelCall("add", (Ref("a"), Ref("b")), (), (Value("buf0", a),), "add", "aten.add.Tensor", pointwise=True)
    p = program(add, Return((Ref("buf0"),), "single"), inputs=(Input("a", a), Input("b", b)))
    out = choose_kernels(p, registry)
    if chosen:
        (choice,) = out.choices
        assert choice.candidates[0] == "add" and "triton_add" in choice.candidates
        assert out.body[0].jit and out.body[0].kernel == choice.local
        assert f'rt.jit["{choice.local}"]' in emit(out).text
    else:
        assert out == p


def test_alias_groups_list_members_in_first_seen_order_after_every_change() -> None:
    groups = Groups()
    for a, b in (("x", "v1"), ("y", "v2"), ("v1", "v3")):
        groups.union(a, b)
    assert groups.members("v3") == ["x", "v1", "v3"] and groups.members("y") == ["y", "v2"]
    assert groups.members("new") == ["new"]  # a name not seen before is its own group
    groups.union("v2", "x")  # a change after members() was asked: the next answer sees it
    assert groups.members("v1") == groups.members("y") == ["x", "v1", "y", "v2", "v3"]
