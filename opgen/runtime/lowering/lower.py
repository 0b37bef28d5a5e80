"""Lowering: an ATen-level FX graph -> a wrapper IR `Program`.

Each `call_function` node with an `OpOverload` target becomes one `KernelCall` to the kernel_ops
function the registry lists for that overload, its arguments mapped by name onto the kernel's
schema (defaults filled in, then left out of the call where they are trailing or keyword-only).
Multi-output kernels unpack into one value per used result, so `getitem` nodes disappear. Ops
the registry lacks are an `UnsupportedOpError`, or with `fallback=True` a call of the ATen op.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from opgen.runtime import registry as reg
from opgen.runtime.errors import UnsupportedOpError
from opgen.runtime.ir import (
    Arg,
    Guard,
    Input,
    JitKernelSpec,
    KernelCall,
    Line,
    Program,
    Ref,
    Return,
    SizeExpr,
    Sym,
    TensorConstant,
    TensorMeta,
    Value,
    defs,
    uses,
)
from opgen.runtime.ir.names import RESERVED, RESERVED_PREFIXES
from opgen.runtime.ir.signature import GraphSignature, PlaceholderSpec
from opgen.runtime.lowering.collectives import CollectiveLowering, is_collective_node, is_opaque
from opgen.runtime.lowering.fx_values import tensor_meta, to_arg
from opgen.runtime.lowering.symbolic import ASSERT_TARGETS, bindings, check_bound, graph_symbols, is_size_node, size_of
from opgen.runtime.lowering.triton import is_triton_node, lower_triton
from opgen.runtime.torch_symbols import sym_of


@dataclass(frozen=True, slots=True)
class Lowered:
    program: Program
    direct: int  # nodes that call kernel_ops
    fallbacks: tuple[tuple[str, str], ...]  # (node, op) of nodes that call the ATen op instead


@dataclass(frozen=True, slots=True)
class LowerOptions:
    fallback: bool = False
    guard: bool = True
    grad_mode: bool = False  # the guard also refuses grad mode (a constant requires grad)
    name: str = "forward"


def lower(
    gm: torch.fx.GraphModule, signature: GraphSignature, registry: reg.KernelRegistry, options: LowerOptions
) -> Lowered:
    return _Lowering(signature, registry, options).run(gm)


def op_name(target: Any) -> str:
    """`aten.add.Tensor` for an OpOverload; `py:module.name` for other callables."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return f"py:{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


@dataclass
class _Lowering:
    signature: GraphSignature
    registry: reg.KernelRegistry
    options: LowerOptions
    names: dict[str, Arg] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    inputs: list[Input] = field(default_factory=list)
    constants: list[TensorConstant] = field(default_factory=list)
    setup: list[Line] = field(default_factory=list)
    body: list[Line] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    jit_kernels: list[JitKernelSpec] = field(default_factory=list)
    collectives: CollectiveLowering = field(default_factory=CollectiveLowering)
    direct: int = 0
    counter: int = 0

    def run(self, gm: torch.fx.GraphModule) -> Lowered:
        self.taken.update(self.registry.by_name)
        self.taken.update(graph_symbols(gm))  # size symbols are locals of their own name
        specs = {p.name: p for p in self.signature.placeholders}
        mutated = {o.target for o in self.signature.outputs if o.kind == "mutation"}
        for node in gm.graph.nodes:
            match node.op:
                case "placeholder":
                    self.placeholder(node, specs[node.name], node.name in mutated)
                case "get_attr":
                    self.get_attr(node, getattr(gm, node.target))
                case "call_function":
                    self.call(node)
                case "output":
                    self.output(node)
                case _:
                    raise UnsupportedOpError(node.op, node.name, f"'{node.op}' nodes are not lowered")
        lets = bindings(self.inputs)
        check_bound(self.inputs, lets, {n for line in self.body for n in uses(line)} - self.defined())
        self.body[:0] = lets
        if self.options.guard:
            self.body.insert(0, Guard(tuple(i.name for i in self.inputs), self.options.grad_mode))
        program = Program(
            self.options.name,
            tuple(self.inputs),
            tuple(self.constants),
            tuple(self.setup),
            tuple(self.body),
            jit_kernels=tuple(self.jit_kernels),
            collectives=self.collectives.specs,
        )
        return Lowered(program, self.direct, tuple(self.fallbacks))

    def defined(self) -> set[str]:
        """Names lines may read other than size symbols: inputs, constants and every value a line defines."""
        names = {i.name for i in self.inputs} | {c.name for c in self.constants}
        return names | {v.name for line in (*self.setup, *self.body) for v in defs(line)}

    def local(self, raw: str) -> str:
        name = re.sub(r"\W", "_", raw) or "v"
        if name[0].isdigit():
            name = "v" + name
        while name in RESERVED or name.startswith(RESERVED_PREFIXES) or name in self.taken:
            name = "in_" + name if name.startswith(RESERVED_PREFIXES) else name + "_"
        self.taken.add(name)
        return name

    def new_buf(self) -> str:
        while f"buf{self.counter}" in self.taken:
            self.counter += 1
        self.taken.add(name := f"buf{self.counter}")
        return name

    def placeholder(self, node: torch.fx.Node, spec: PlaceholderSpec, mutated: bool) -> None:
        if isinstance(node.meta.get("val"), torch.SymInt | int) and spec.kind == "input":
            self.size_input(node)
            return
        if is_opaque(node):  # an object torch.compile passes beside a tensor (a DTensor's spec), never read
            if spec.kind == "input":
                self.inputs.append(Input(self.local(node.name), TensorMeta((), (), "int64", "cpu"), opaque=True))
            return
        meta = tensor_meta(node.meta["val"], f"input '{node.name}'")
        name = self.local(node.name)
        self.names[node.name] = Ref(name)
        if spec.kind == "input":
            self.inputs.append(Input(name, meta))
        else:
            self.constants.append(TensorConstant(name, spec.key or node.name, meta, mutated))

    def size_input(self, node: torch.fx.Node) -> None:
        """A SymInt placeholder (torch.compile): a Python int argument named after its symbol where it is one.

        Dynamo may pass one symbol twice (the prompt's length as `input_ids`'s size and as
        `cache_position`'s, in transformers' generate()): the first names it, later ones keep their node's
        name, as two arguments of one name would not compile."""
        size = size_of(node.meta["val"], f"input '{node.name}'")
        plain = isinstance(size, SizeExpr) and size.symbols == (size.text,)
        first = plain and isinstance(size, SizeExpr) and all(i.name != size.text for i in self.inputs)
        name = size.text if first and isinstance(size, SizeExpr) else self.local(node.name)
        self.names[node.name] = size if plain else Ref(name)
        expr = size if isinstance(size, SizeExpr) else SizeExpr(str(size), ())
        self.inputs.append(Input(name, TensorMeta((), (), "int64", "cpu"), expr))

    def get_attr(self, node: torch.fx.Node, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            raise UnsupportedOpError("get_attr", node.name, f"attribute of type {type(value).__name__}")
        name = self.local(node.name)
        self.names[node.name] = Ref(name)
        self.constants.append(TensorConstant(name, f"attr:{node.target}", tensor_meta(value, node.name)))

    def call(self, node: torch.fx.Node) -> None:
        if node.target is operator.getitem:
            self.getitem(node)
            return
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            _check_static_assert(node)  # static metas already prove it: no code
            return
        if is_size_node(node):  # shape arithmetic: the IR carries its expression, printed where used
            self.names[node.name] = size_of(node.meta["val"], f"node '{node.name}'")
            return
        if node.target in ASSERT_TARGETS or isinstance(node.meta.get("val"), torch.SymBool):
            return  # range asserts: the input check enforces the ranges they come from
        if is_triton_node(node) or is_collective_node(node):
            self.body.extend(lower_triton(self, node) if is_triton_node(node) else self.collectives.lower(self, node))
            self.direct += 1
            return
        reason = ""
        if isinstance(node.target, torch._ops.OpOverload):
            info = self.registry.lookup(node.target.name())
            if info is not None:
                try:
                    self.direct_call(node, info)
                    return
                except reg.BindError as exc:
                    reason = str(exc)
        if not self.options.fallback:
            custom = isinstance(node.target, torch._ops.OpOverload) and node.target.namespace not in ("aten", "prims")
            raise UnsupportedOpError(op_name(node.target), node.name, reason, custom=custom)
        self.fallback_call(node)

    def getitem(self, node: torch.fx.Node) -> None:
        if node.name in self.names:  # named when its producer was lowered
            return
        source, index = node.args
        assert isinstance(source, torch.fx.Node) and isinstance(index, int | str)
        items = self.names[source.name]
        if isinstance(items, dict):  # a Triton kernel's written tensors, by parameter name
            self.names[node.name] = items[index]
            return
        if not isinstance(items, tuple):
            raise UnsupportedOpError("getitem", node.name, f"indexing a value that is not a tuple ({items!r})")
        self.names[node.name] = items[index]

    def direct_call(self, node: torch.fx.Node, info: reg.OpInfo) -> None:
        where = f"node '{node.name}'"
        args = [to_arg(a, self.names, where) for a in node.args]
        kwargs = {k: to_arg(v, self.names, where) for k, v in node.kwargs.items()}
        values = reg.bind(info, args, kwargs)
        info, values = self.scalars_as_scalars(node, info, values)
        positional, keywords = reg.call_args(info, values)
        mutates = tuple(v.name for m in info.mutates if isinstance(v := values[m], Ref))
        outputs: tuple[Value | None, ...] = ()
        unpack = False
        if info.variant != "functional":  # in-place/out ops: the result is the written argument itself
            self.names[node.name] = Ref(mutates[0])
        else:
            outputs, unpack = self.outputs(node, info.returns_tuple or info.returns_list)
        assert isinstance(node.target, torch._ops.OpOverload)
        pointwise = torch.Tag.pointwise in node.target.tags
        seeded = torch.Tag.nondeterministic_seeded in node.target.tags
        target = op_name(node.target)
        self.body.append(
            KernelCall(
                info.name,
                positional,
                keywords,
                outputs,
                node.name,
                target,
                unpack,
                mutates,
                False,
                pointwise,
                seeded=seeded,
            )
        )
        self.direct += 1

    def scalars_as_scalars(
        self, node: torch.fx.Node, info: reg.OpInfo, values: dict[str, Arg]
    ) -> tuple[reg.OpInfo, dict[str, Arg]]:
        """Numbers the graph passes for `Tensor` arguments: the op's Scalar overload, else a 0-dim tensor."""
        numbers = {a.name for a in info.args if a.type == "Tensor" and _is_number(values[a.name])}
        if not numbers:
            return info, values
        other = reg.scalar_overload(self.registry, info, numbers)
        if other is not None:
            return other, values
        values = dict(values)
        for name in sorted(numbers):
            values[name] = self.wrapped_scalar(values[name], node.name)
        return info, values

    def wrapped_scalar(self, value: Arg, node: str) -> Ref:
        """A 0-dim tensor with the promotion behaviour of a wrapped Python number (int64/default float/bool)."""
        if self.registry.by_name.get("scalar_tensor") is None:
            raise UnsupportedOpError("aten.scalar_tensor.default", node, "needed to pass a number as a tensor")
        dtype = "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else None
        dtype = dtype or str(torch.get_default_dtype()).removeprefix("torch.")
        name = self.new_buf()
        meta = tensor_meta(torch.empty((), dtype=getattr(torch, dtype)), node)
        kwargs = (("dtype", sym_of(getattr(torch, dtype))),)
        lines = self.body if isinstance(value, SizeExpr) else self.setup  # a size is known per call only
        lines.append(
            KernelCall(
                "scalar_tensor",
                (value,),
                kwargs,
                (Value(name, meta),),
                f"{node} (number as tensor)",
                "aten.scalar_tensor.default",
            )
        )
        return Ref(name)

    def outputs(self, node: torch.fx.Node, multi: bool) -> tuple[tuple[Value | None, ...], bool]:
        val = node.meta.get("val")
        if not multi:
            if not isinstance(val, torch.Tensor):
                return (), False
            name = self.new_buf()
            self.names[node.name] = Ref(name)
            return (Value(name, tensor_meta(val, f"node '{node.name}'")),), False
        assert isinstance(val, list | tuple), f"node '{node.name}' has no meta for its results"
        getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        used_whole = any(u.target is not operator.getitem for u in node.users)
        outputs: list[Value | None] = []
        for i, item in enumerate(val):
            if (i in getitems or used_whole) and isinstance(item, torch.Tensor):
                name = self.new_buf()
                outputs.append(Value(name, tensor_meta(item, f"node '{node.name}'[{i}]")))
                if i in getitems:
                    self.names[getitems[i].name] = Ref(name)
            else:
                outputs.append(None)
        self.names[node.name] = tuple(Ref(v.name) if v else None for v in outputs)
        return tuple(outputs), True

    def fallback_call(self, node: torch.fx.Node) -> None:
        where = f"node '{node.name}'"
        args = tuple(to_arg(a, self.names, where) for a in node.args)
        kwargs = tuple((k, to_arg(v, self.names, where)) for k, v in node.kwargs.items())
        val = node.meta.get("val")
        outputs, unpack = self.outputs(node, isinstance(val, list | tuple))
        target = op_name(node.target)
        seeded = torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
        self.body.append(
            KernelCall(target, args, kwargs, outputs, node.name, target, unpack, fallback=True, seeded=seeded)
        )
        self.fallbacks.append((node.name, target))

    def output(self, node: torch.fx.Node) -> None:
        self.body.extend(self.collectives.flush(self))  # collectives the graph never waited for
        values = node.args[0] if isinstance(node.args[0], list | tuple) else (node.args[0],)
        user: list[Arg] = []
        for spec, value in zip(self.signature.outputs, values, strict=True):
            arg = to_arg(value, self.names, "graph output")
            if spec.kind == "user":
                user.append(arg)
                continue
            target = self.names[spec.target or ""]
            assert isinstance(target, Ref)
            self.body.append(
                KernelCall(
                    "copy_",
                    (target, arg),
                    (),
                    (),
                    f"write back {spec.target}",
                    "aten.copy_.default",
                    mutates=(target.name,),
                )
            )
        self.body.append(Return(tuple(user), self.signature.form))


def _check_static_assert(node: torch.fx.Node) -> None:
    """`_assert_tensor_metadata(a, size, stride, dtype, device=, layout=)` against a's static meta."""
    source = node.args[0]
    assert isinstance(source, torch.fx.Node)
    tensor = source.meta["val"]
    if any(isinstance(n, torch.SymInt) for n in (*tensor.shape, *tensor.stride())):
        return  # symbolic metas: the input check and the shape environment's guards stand for it
    expected = dict(zip(("size", "stride", "dtype"), node.args[1:], strict=False)) | dict(node.kwargs)
    actual = {
        "size": list(tensor.shape),
        "stride": list(tensor.stride()),
        "dtype": tensor.dtype,
        "device": tensor.device,
        "layout": tensor.layout,
    }
    for key, value in expected.items():
        if value is not None and (list(value) if isinstance(value, list | tuple) else value) != actual[key]:
            raise UnsupportedOpError(
                "aten._assert_tensor_metadata", node.name, f"asserts {key}={value}, the graph has {actual[key]}"
            )


def _is_number(arg: Arg) -> bool:
    return isinstance(arg, bool | int | float | SizeExpr) or (isinstance(arg, Sym) and arg.kind == "float")
