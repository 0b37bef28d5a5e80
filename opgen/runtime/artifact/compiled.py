"""The compiled artifact: generated source plus what binding it needs. It knows nothing of execution.

A `CompiledGraph` is plain data: the source text, the input specs its check compares against, the
kernels, ATen ops, symbols and constant keys the source binds, how outputs are rebuilt, the calls
that draw random numbers, and the report facts. It round-trips through JSON, which is how the disk
cache stores it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from opgen.runtime.codegen.backend import Printed, Source
from opgen.runtime.ir import (
    Arg,
    Collective,
    FusedKernel,
    Input,
    JitKernelSpec,
    KernelCall,
    KernelChoice,
    Program,
    TensorMeta,
    Value,
    program_lines,
)
from opgen.runtime.ir.sizes import SizeRange

FORMAT = 8


@dataclass(frozen=True, slots=True)
class InputSpec:
    """What an input must be; with dynamic shapes, sizes and strides may be size texts (`s27`, `16*s27`)."""

    name: str
    shape: tuple[int | str, ...]
    stride: tuple[int | str, ...]
    dtype: str
    device: str
    size: bool = False  # a Python int (torch.compile's SymInt input), not a tensor

    @classmethod
    def of(cls, i: Input) -> InputSpec:
        shape = tuple(n if isinstance(n, int) else n.text for n in i.meta.shape)
        stride = tuple(n if isinstance(n, int) else n.text for n in i.meta.stride)
        return cls(i.name, shape, stride, i.meta.dtype, i.meta.device, i.size is not None)


@dataclass(frozen=True, slots=True)
class CompiledGraph:
    key: str
    name: str  # the generated function
    source: str
    inputs: tuple[InputSpec, ...]
    kernels: tuple[str, ...]
    fallbacks: tuple[str, ...]  # ATen ops the source calls (`aten.sort.default`)
    symbols: tuple[tuple[str, str, str], ...]  # (local, kind, value)
    constants: tuple[tuple[str, str], ...]  # (local, key into the constants mapping)
    written_inputs: tuple[int, ...] = ()  # positions of inputs the graph writes
    written_constants: tuple[str, ...] = ()  # keys of constants (buffers) the graph writes
    jit_kernels: tuple[JitKernelSpec, ...] = ()  # Triton kernels it launches (see opgen/jit)
    choices: tuple[KernelChoice, ...] = ()  # nodes whose kernel is picked on the first call
    fused: tuple[FusedKernel, ...] = ()  # generated Triton kernels of fused node groups (their `lines` dropped)
    direct_nodes: int = 0
    fallback_nodes: tuple[tuple[str, str], ...] = ()
    passes: tuple[str, ...] = ()
    codegen_seconds: float = 0.0
    ranges: tuple[tuple[str, int, int | None], ...] = ()  # dynamic shapes: (size symbol, low, high or None)
    notes: tuple[str, ...] = ()  # what passes said about symbolic sizes, for report()
    splits: tuple[tuple[str, int], ...] = ()  # (symbol, n): worth compiling below n and from n apart
    random_calls: tuple[tuple[str, str], ...] = ()  # (node, ATen op) of each call drawing random numbers
    collectives: tuple[Collective, ...] = ()  # torch.distributed collectives, bound to their groups at load
    printed: tuple[tuple[str, Printed], ...] = ()  # other backends' programs by name (`opgen.runtime.backends`)
    from_cache: bool = field(default=False, compare=False)

    def printed_by(self, backend: str) -> Printed:
        """The program `backend` printed for this graph (empty where it printed none)."""
        return next((p for name, p in self.printed if name == backend), Printed())

    @property
    def cpp_program(self) -> str:
        """The C++ executor's program (`printed_by("cpp").text`; empty where it has none)."""
        return self.printed_by("cpp").text

    @property
    def size_ranges(self) -> tuple[SizeRange, ...]:
        return tuple(SizeRange(*r) for r in self.ranges)

    @property
    def dynamic(self) -> bool:
        return bool(self.ranges)

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("from_cache")
        return json.dumps({"format": FORMAT, **data}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CompiledGraph:
        data: dict[str, Any] = json.loads(text)
        if data.pop("format", None) != FORMAT:
            raise ValueError("compiled graph written by another opgen format version")
        data["inputs"] = tuple(
            InputSpec(s["name"], tuple(s["shape"]), tuple(s["stride"]), s["dtype"], s["device"], s["size"])
            for s in data["inputs"]
        )
        for name in ("kernels", "fallbacks", "passes", "written_inputs", "written_constants", "notes"):
            data[name] = tuple(data[name])
        for name in ("symbols", "constants", "fallback_nodes", "ranges", "splits", "random_calls"):
            data[name] = tuple(tuple(item) for item in data[name])
        data["jit_kernels"] = tuple(_jit_spec(s) for s in data.get("jit_kernels", ()))
        data["choices"] = tuple(
            KernelChoice(c["local"], tuple(c["candidates"]), c["node"], c["target"]) for c in data.get("choices", ())
        )
        data["fused"] = tuple(_fused(f) for f in data.get("fused", ()))
        data["collectives"] = tuple(Collective(**c) for c in data.get("collectives", ()))
        data["printed"] = tuple((name, Printed(**p)) for name, p in data.get("printed", ()))
        return cls(**data, from_cache=True)

    @property
    def cacheable(self) -> bool:
        """Can another process rebuild it from disk? (Every Triton kernel importable by name.)"""
        return all(k.importable for k in self.jit_kernels)

    def cached(self) -> CompiledGraph:
        return replace(self, from_cache=True)


def compiled_graph(
    key: str, program: Program, source: Source, written: Collection[str] = frozenset(), **facts: Any
) -> CompiledGraph:
    """The artifact of a program; `written` names the inputs and constants its body writes."""
    return CompiledGraph(
        key=key,
        name=program.name,
        source=source.text,
        inputs=tuple(InputSpec.of(i) for i in program.inputs),
        kernels=source.manifest.kernels,
        fallbacks=source.manifest.fallbacks,
        symbols=tuple((local, sym.kind, sym.value) for local, sym in source.manifest.symbols),
        constants=source.manifest.constants,
        written_inputs=tuple(i for i, spec in enumerate(program.inputs) if spec.name in written),
        written_constants=tuple(c.key for c in program.constants if c.name in written),
        notes=program.notes,
        splits=program.splits,
        jit_kernels=program.jit_kernels,
        choices=program.choices,
        fused=tuple(replace(f, lines=()) for f in program.fused),
        random_calls=random_calls(program),
        collectives=program.collectives,
        **facts,
    )


# Ops torch tags random (`nondeterministic_seeded`) only for their dropout: where the probability is a
# constant 0 they draw no random number (the kernels test `dropout_p > 0` before they touch the
# generator). (position, name, default) of the probability; tests/runtime/test_cuda_graphs_cpu.py checks
# them against torch's schemas.
DROPOUT_P: dict[str, tuple[int, str, float | None]] = {
    "aten.scaled_dot_product_attention.default": (4, "dropout_p", 0.0),
    "aten._scaled_dot_product_attention_math.default": (4, "dropout_p", 0.0),
    "aten._scaled_dot_product_flash_attention.default": (3, "dropout_p", 0.0),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (3, "dropout_p", 0.0),
    "aten._scaled_dot_product_efficient_attention.default": (5, "dropout_p", 0.0),
    "aten._scaled_dot_product_cudnn_attention.default": (5, "dropout_p", 0.0),
    "aten._scaled_dot_product_fused_attention_overrideable.default": (4, "dropout_p", 0.0),
    "aten._efficient_attention_forward.default": (8, "dropout_p", None),
    "aten._flash_attention_forward.default": (7, "dropout_p", None),
}
# Dropout ops that draw nothing where `train` is a constant False: (position, name) of `train`.
DROPOUT_TRAIN: dict[str, tuple[int, str]] = {
    "aten.dropout.default": (2, "train"),
    "aten.native_dropout.default": (2, "train"),
}


def random_calls(program: Program) -> tuple[tuple[str, str], ...]:
    """(node, ATen op) of each call that draws random numbers: a random op (`seeded`), less those whose
    constant arguments say they draw none (SDPA at dropout_p=0, dropout with train=False)."""
    return tuple(
        (line.node, line.target)
        for line in program_lines(program)
        if isinstance(line, KernelCall) and line.seeded and not _draws_nothing(line)
    )


def _draws_nothing(call: KernelCall) -> bool:
    if call.target in DROPOUT_P:
        position, name, default = DROPOUT_P[call.target]
        p = _argument(call, position, name, default)
        return type(p) in (int, float) and p == 0
    if call.target in DROPOUT_TRAIN:
        return _argument(call, *DROPOUT_TRAIN[call.target], None) is False
    return False


def _argument(call: KernelCall, position: int, name: str, default: Arg) -> Arg:
    """The call's value of one schema argument (positional or keyword; left out: its default)."""
    kwargs = dict(call.kwargs)
    if name in kwargs:
        return kwargs[name]
    return call.args[position] if position < len(call.args) else default


def _jit_spec(data: dict[str, Any]) -> JitKernelSpec:
    configs = _configs(data["configs"])
    examples = tuple((kind, _tuples(value)) for kind, value in data["examples"])
    return JitKernelSpec(data["local"], data["kernel"], tuple(data["params"]), configs, tuple(data["mutates"]),
                         examples, data["node"], data["importable"])  # fmt: skip


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the IR holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _configs(data: Any) -> Any:
    return tuple(
        (tuple((k, _tuples(v)) for k, v in meta), warps, stages, tuple(grid)) for meta, warps, stages, grid in data
    )


def _fused(data: dict[str, Any]) -> FusedKernel:
    def value(v: dict[str, Any]) -> Value:
        m = v["meta"]
        meta = TensorMeta(tuple(m["shape"]), tuple(m["stride"]), m["dtype"], m["device"], m["offset"])
        return Value(v["name"], meta)

    return FusedKernel.make(
        data["local"],
        None,
        inputs=zip(data["inputs"], data["input_dtypes"], strict=True),
        outputs=(value(v) for v in data["outputs"]),
        nodes=data["nodes"],
        describe=data["describe"],
        writes=(value(v) for v in data.get("writes", ())),
        dependent_launch=data.get("dependent_launch", False),
    ).printed(data["name"], data["source"], _configs(data["configs"]))
