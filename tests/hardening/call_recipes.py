"""What the call fuzzer varies: a recipe (plain data, drawn by hypothesis) and how it becomes arguments.

A recipe names a function, one of its valid samples from `tests/ops/samples.py` (a dtype and an
index), and a list of mutations. `materialize` turns it into (args, kwargs) deterministically, so
the kernel_ops call and the eager call get equal but separate arguments (aliasing included).

Mutations cover the issue's list: right and wrong types, None, scalars of every kind, empty,
zero-size, 0-dim, non-contiguous and expanded tensors, every dtype, huge and negative sizes,
aliasing between inputs and outputs, extra and unknown keywords, and a tensor that another thread
keeps resizing (`RACY`: no eager comparison for those calls, only "no crash, clean error").
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
import samples

DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)
BIG = (2**31, 2**32 + 1, 2**62, 2**63 - 1, -(2**63), 2**63, 2**64, 2**100)
INTS = (0, 1, -1, 2, 3, -2, -7, 17, *BIG)
FLOATS = (0.0, -0.0, 0.5, -1.5, 1e-300, 1e308, float("inf"), float("-inf"), float("nan"))
STRINGS = ("", "x", "none", "tanh", "floor", "trunc", "\udc80", "é" * 3, "a\x00b", "reflect" * 1000)
OBJECTS = (
    None,
    True,
    False,
    1 + 2j,
    b"bytes",
    (),
    [],
    [None],
    [1, 2.5],
    [[1]],
    {"a": 1},
    object(),
    torch.float32,
    torch.int64,
    torch.strided,
    torch.sparse_coo,
    torch.channels_last,
    torch.contiguous_format,
    torch.device("cpu"),
    torch.device("meta"),
    "cpu",
    "meta",
    "cuda",
    "cpu:0",
    "not-a-device",
    slice(1),
    ...,
)


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str  # kernel_ops function
    dtype: torch.dtype  # the sample's dtype
    index: int  # which sample
    mutations: tuple[tuple[Any, ...], ...]
    seed: int

    @property
    def racy(self) -> bool:
        return any(m[0] == "racy" for m in self.mutations)


def value_strategy(depth: int = 0) -> st.SearchStrategy[Any]:
    """Any argument value: numbers of every kind, strings, lists, special objects, tensors."""
    leaves = st.one_of(
        st.sampled_from(INTS),
        st.integers(-(2**65), 2**65),
        st.sampled_from(FLOATS),
        st.floats(allow_nan=True, allow_infinity=True),
        st.complex_numbers(allow_nan=True),
        st.sampled_from(STRINGS),
        st.text(max_size=8),
        st.sampled_from(OBJECTS),
        tensor_strategy(),
    )
    if depth >= 1:
        return leaves
    lists = st.lists(st.one_of(st.sampled_from(INTS), st.integers(-8, 8), leaves), max_size=5)
    return st.one_of(leaves, lists, lists.map(tuple))


def tensor_strategy() -> st.SearchStrategy[tuple[Any, ...]]:
    """A tensor as plain data: ("tensor", dtype, shape, kind)."""
    shape = st.lists(st.integers(0, 5), max_size=4).map(tuple)
    kind = st.sampled_from(("contiguous", "transposed", "sliced", "expanded", "channels_last"))
    return st.tuples(st.just("tensor"), st.sampled_from(DTYPES), shape, kind)


@st.composite
def recipes(draw: st.DrawFn, name: str, spec: samples.OpSamples, info: dict[str, Any]) -> Recipe:
    dtype = draw(st.sampled_from(spec.dtypes))
    count = len(spec.build(dtype))
    index = draw(st.integers(0, max(count - 1, 0)))
    names = [a["name"] for a in info["args"]]
    n = draw(st.integers(0, 3))
    mutations = tuple(draw(mutation(names)) for _ in range(n))
    return Recipe(name, dtype, index, mutations, draw(st.integers(0, 2**16)))


def mutation(names: list[str]) -> st.SearchStrategy[tuple[Any, ...]]:
    slot = st.integers(0, max(len(names) - 1, 0))
    name = st.sampled_from(names) if names else st.just("self")
    tensor_change = st.sampled_from(("dtype", "noncontiguous", "expanded", "empty", "zero_dim", "channels_last"))
    return st.one_of(
        st.tuples(st.just("value"), slot, value_strategy()),
        st.tuples(st.just("keyword"), name, value_strategy()),
        st.tuples(st.just("tensor"), slot, tensor_change, st.sampled_from(DTYPES)),
        st.tuples(st.just("alias"), slot, slot, st.booleans()),
        st.tuples(st.just("int_list"), slot, st.lists(st.sampled_from(INTS), max_size=4)),
        st.tuples(st.just("drop"), slot),
        st.tuples(st.just("extra"), value_strategy(depth=1)),
        st.tuples(st.just("unknown_keyword"), st.sampled_from(("no_such", "\udc80", "é", "self ", ""))),
        st.tuples(st.just("racy"), slot),
    )


def make_tensor(spec: tuple[Any, ...], gen: torch.Generator) -> torch.Tensor:
    _, dtype, shape, kind = spec
    full = [max(d, 1) * (2 if kind == "sliced" and i == len(shape) - 1 else 1) for i, d in enumerate(shape)]
    t = _random((*full,), dtype, gen)
    match kind:
        case "transposed" if len(shape) >= 2:
            t = _random((*shape[:-2], shape[-1], shape[-2]), dtype, gen).transpose(-1, -2)
        case "sliced" if shape:
            t = t[..., ::2]
        case "expanded" if shape:
            t = t[..., :1].expand(*shape[:-1], shape[-1])
        case "channels_last" if len(shape) == 4:
            t = _random(shape, dtype, gen).contiguous(memory_format=torch.channels_last)
    slices = tuple(slice(0, d) for d in shape)
    return t[slices] if slices and kind != "expanded" else t


def _random(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    t = torch.randint(-3, 4, shape, generator=gen, dtype=torch.int64)
    if dtype.is_floating_point or dtype.is_complex:
        t = t.double() + torch.rand(shape, generator=gen, dtype=torch.float64)
    return t.to(dtype)


def _change(t: torch.Tensor, how: str, dtype: torch.dtype) -> torch.Tensor:
    match how:
        case "dtype":
            return t.to(dtype)
        case "noncontiguous" if t.dim() >= 1:
            wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
            wide[..., ::2] = t
            return wide[..., ::2]
        case "expanded" if t.dim() >= 1 and t.numel() > 0:
            return t[..., :1].expand(t.shape)
        case "empty" if t.dim() >= 1:
            return t.narrow(-1, 0, 0)
        case "zero_dim" if t.numel() > 0:
            return t.flatten()[0].clone()
        case "channels_last" if t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
    return t


def materialize(recipe: Recipe, racy: torch.Tensor | None = None) -> tuple[list[Any], dict[str, Any]]:
    """The call's (args, kwargs); equal recipes give equal, unshared arguments."""
    spec = samples.SAMPLES[sample_key(recipe.name)]
    built = spec.build(recipe.dtype)
    sample = built[recipe.index] if built else samples.Sample(())
    args, kwargs = list(sample.args), dict(sample.kwargs)
    gen = torch.Generator().manual_seed(recipe.seed)
    info = _info(recipe.name)
    names = [a["name"] for a in info["args"]]
    if info["variant"] == "out":
        _add_outs(recipe, info, args, kwargs, gen)
    for m in recipe.mutations:
        _apply(m, args, kwargs, names, gen, racy)
    return args, kwargs


def _add_outs(recipe: Recipe, info: dict[str, Any], args: list[Any], kwargs: dict[str, Any], gen: Any) -> None:
    """Outputs as the eager-parity test makes them: like the functional result, or 0-size."""
    functional = _aten(info["functional"]) if info["functional"] else None
    try:
        template = functional(*args, **kwargs) if functional else None
    except Exception:
        template = None
    templates = template if isinstance(template, tuple) else (template,)
    for k, arg in enumerate(a for a in info["args"] if a.get("out")):
        t = templates[k] if k < len(templates) and isinstance(templates[k], torch.Tensor) else None
        kwargs[arg["name"]] = (
            torch.zeros_like(t) if t is not None and recipe.seed % 2 else _random((0,), recipe.dtype, gen)
        )


def _apply(m: tuple[Any, ...], args: list[Any], kwargs: dict[str, Any], names: list[str], gen: Any, racy: Any) -> None:
    def get(i: int) -> Any:
        return args[i] if i < len(args) else kwargs.get(names[i]) if i < len(names) else None

    def put(i: int, value: Any) -> None:
        if i < len(args):
            args[i] = value
        elif i < len(names):
            kwargs[names[i]] = value

    def value(v: Any) -> Any:
        return make_tensor(v, gen) if isinstance(v, tuple) and v[:1] == ("tensor",) else v

    match m:
        case ("value", i, v):
            put(i, [value(x) for x in v] if isinstance(v, list) else value(v))
        case ("keyword", name, v):
            kwargs[name] = value(v)
        case ("tensor", i, how, dtype) if isinstance(get(i), torch.Tensor) and get(i) is not racy:
            # (not the racy tensor: copying it here, with the GIL released, would race the resizer)
            put(i, _change(get(i), how, dtype))
        case ("alias", i, j, view) if isinstance(get(i), torch.Tensor) and i != j:
            source = get(i)
            put(j, source.view(source.shape) if view else source)
        case ("int_list", i, values) if isinstance(get(i), (int, list, tuple)) and not isinstance(get(i), bool):
            put(i, list(values))
        case ("drop", i) if i < len(args):
            del args[i:]
        case ("extra", v):
            args.append(value(v))
        case ("unknown_keyword", name):
            kwargs[name] = 1
        case ("racy", i) if racy is not None and isinstance(get(i), torch.Tensor):
            put(i, racy)


def _info(name: str) -> dict[str, Any]:
    from opgen import kernel_ops

    return kernel_ops.get_kernel_op_info(name)


def _aten(name: str) -> Any:
    if _info(name)["aten"] in samples.EAGER:  # one of opgen's own kernels
        return samples.EAGER[_info(name)["aten"]]
    op, _, overload = _info(name)["aten"].removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


def aten_op(name: str) -> Any:
    return _aten(name)


def sample_key(name: str) -> str:
    info = _info(name)
    return _info(info["functional"] or name)["aten"].removeprefix("aten::")
