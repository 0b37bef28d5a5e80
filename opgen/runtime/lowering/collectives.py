"""Lowering torch.distributed's functional collectives (`_c10d_functional.*`) to issue and wait lines.

torch.compile and torch.export trace `dist.all_reduce(...)` (and DTensor's redistributions) as
`_c10d_functional.all_reduce(input, "sum", group_name)` followed by `wait_tensor(result)`. Each
collective node becomes, as `torch/csrc/distributed/c10d/Functional.cpp` runs it:

- its outputs: a contiguous clone of the input for all_reduce and broadcast (the collective then
  works in place on it), an `Alloc` for all_gather, reduce_scatter and all_to_all; none for the
  in-place forms (`all_reduce_`, `broadcast_`), which write their input;
- one issue line, `work = c10d_all_reduce(buf)`, calling a callable bound at load time to the
  process group the graph names (a `Collective` record, see `opgen.runtime.execution.collectives`);
- one wait line, `c10d_wait(work, <tensors in flight>)`, where the graph's first `wait_tensor` on one
  of its outputs is (or before the graph's outputs, for a collective nobody waits for).

The group is named, not resolved: the record keeps the name and the group size the graph was
traced for (from the op's `group_size`, or the live group's size where one exists), and binding
checks both. `passes.collectives` then moves issues early and waits late.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from opgen.runtime.errors import UnsupportedOpError
from opgen.runtime.ir import Alloc, Arg, Collective, KernelCall, Line, Ref, Sym, Value
from opgen.runtime.lowering.fx_values import tensor_meta, to_arg

NAMESPACE = "_c10d_functional"
REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")  # Functional.cpp's to_reduce_op

# op name -> (record kind, how its outputs are made: "clone" | "alloc" | "inplace", takes a list of tensors)
_OPS: dict[str, tuple[str, str, bool]] = {
    "all_reduce": ("all_reduce", "clone", False),
    "all_reduce_": ("all_reduce", "inplace", False),
    "all_reduce_coalesced": ("all_reduce_coalesced", "clone", True),
    "all_reduce_coalesced_": ("all_reduce_coalesced", "inplace", True),
    "all_gather_into_tensor": ("all_gather", "alloc", False),
    "all_gather_into_tensor_coalesced": ("all_gather_coalesced", "alloc", True),
    "reduce_scatter_tensor": ("reduce_scatter", "alloc", False),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_coalesced", "alloc", True),
    "all_to_all_single": ("all_to_all", "alloc", False),
    "broadcast": ("broadcast", "clone", False),
    "broadcast_": ("broadcast", "inplace", False),
}


def is_collective_node(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == NAMESPACE


@dataclass
class _Work:
    name: str
    outputs: tuple[str, ...]  # tensors the collective writes
    inputs: tuple[str, ...]  # tensors it reads that it does not write
    node: str
    waited: bool = False


@dataclass
class CollectiveLowering:
    """The collectives of one graph: their records, and the Work of each output not waited for yet."""

    records: dict[tuple[Any, ...], Collective] = field(default_factory=dict)
    pending: dict[str, _Work] = field(default_factory=dict)  # output tensor -> its Work
    works: list[_Work] = field(default_factory=list)

    @property
    def specs(self) -> tuple[Collective, ...]:
        return tuple(self.records.values())

    def lower(self, lowering: Any, node: torch.fx.Node) -> list[Line]:
        """The lines of one `_c10d_functional` node; names its result in `lowering.names`."""
        assert isinstance(node.target, torch._ops.OpOverload)
        name = node.target._opname
        values = _arguments(node)
        where = f"node '{node.name}'"
        if name == "wait_tensor":
            ref = to_arg(values["tensor"], lowering.names, where)
            lowering.names[node.name] = ref
            work = self.pending.get(ref.name) if isinstance(ref, Ref) else None
            return self._wait(lowering, work, node.name) if work is not None else []
        if name not in _OPS:
            raise UnsupportedOpError(f"{NAMESPACE}.{name}", node.name, "opgen does not lower this collective yet")
        kind, made_by, many = _OPS[name]
        record = self._record(lowering, node, kind, values)
        sources = values["inputs"] if many else [values["input"]]
        items = tuple(to_arg(n, lowering.names, where) for n in sources)
        assert all(isinstance(i, Ref) for i in items), f"{where}: inputs {items!r}"
        lines: list[Line] = []
        if made_by == "alloc":  # the process group reads its inputs as they are: make them dense
            items = tuple(_dense(lowering, i, n, where, lines) for i, n in zip(items, sources, strict=True))  # type: ignore[arg-type]
        outs = _outputs(lowering, node, items, made_by, lines)  # type: ignore[arg-type]
        args: tuple[Arg, ...] = (tuple(outs),) if many else (outs[0],)
        if made_by == "alloc":
            args = (*args, items if many else items[0])
        if kind == "all_to_all":
            args = (*args, *(to_arg(values[k], lowering.names, where) for k in _SPLITS))
        read = tuple(i.name for i in items) if made_by == "alloc" else ()  # type: ignore[union-attr]
        work = _Work(lowering.local(f"work_{node.name}"), tuple(o.name for o in outs), read, node.name)
        lines.append(
            KernelCall(record.local, args, (), (Value(work.name),), node.name, f"{NAMESPACE}.{name}.default",
                       mutates=work.outputs, jit=True)
        )  # fmt: skip
        self.works.append(work)
        self.pending.update(dict.fromkeys(work.outputs, work))
        lowering.names[node.name] = tuple(outs) if many else outs[0]
        return lines

    def flush(self, lowering: Any) -> list[Line]:
        """Waits for the collectives the graph never waited for (before its outputs are returned)."""
        return [line for work in self.works if not work.waited for line in self._wait(lowering, work, work.node)]

    def _wait(self, lowering: Any, work: _Work, node: str) -> list[Line]:
        if work.waited:
            return []
        work.waited = True
        for name in work.outputs:
            self.pending.pop(name, None)
        local = self._wait_local(lowering)
        tensors = tuple(Ref(n) for n in (*work.outputs, *work.inputs))
        target = f"{NAMESPACE}.wait_tensor.default"
        return [KernelCall(local, (Ref(work.name), *tensors), (), (), node, target, mutates=work.outputs, jit=True)]

    def _wait_local(self, lowering: Any) -> str:
        key = ("wait",)
        if key not in self.records:
            self.records[key] = Collective(lowering.local("c10d_wait"), "wait")
        return self.records[key].local

    def _record(self, lowering: Any, node: torch.fx.Node, kind: str, values: dict[str, Any]) -> Collective:
        group = group_name(values["group_name"], node)
        reduce_op = str(values.get("reduce_op", "")).lower()
        if "reduce_op" in values and reduce_op not in REDUCE_OPS:
            raise UnsupportedOpError(
                f"{NAMESPACE}.{node.target._opname}", node.name,  # type: ignore[union-attr]
                f"reduce op '{reduce_op}' (opgen knows {', '.join(REDUCE_OPS)})",
            )  # fmt: skip
        size = values.get("group_size")
        size = int(size) if size is not None else live_group_size(group)
        root = int(values.get("src", 0))
        key = (kind, group, size, reduce_op, root)
        if key not in self.records:
            local = lowering.local(f"c10d_{kind}")
            self.records[key] = Collective(local, kind, group, size, reduce_op, root, node.name)
        return self.records[key]


_SPLITS = ("output_split_sizes", "input_split_sizes")


def _outputs(lowering: Any, node: torch.fx.Node, items: tuple[Ref, ...], made_by: str, lines: list[Line]) -> list[Ref]:
    """The tensors a collective writes: its inputs (in-place forms), or fresh clones of them, or allocations."""
    if made_by == "inplace":
        return list(items)
    vals = node.meta["val"] if isinstance(node.meta["val"], list | tuple) else [node.meta["val"]]
    outs: list[Ref] = []
    for item, val in zip(items, vals, strict=True):
        value = Value(lowering.new_buf(), tensor_meta(val, f"node '{node.name}'"))
        lines.append(Alloc(value) if made_by == "alloc" else _clone(item, value, node.name))
        outs.append(Ref(value.name))
    return outs


def _dense(lowering: Any, tensor: Ref, source: torch.fx.Node, where: str, lines: list[Line]) -> Ref:
    """`tensor`, or a contiguous copy of it where it is not contiguous (the process group reads it as it is)."""
    meta = tensor_meta(source.meta["val"], where)
    if meta.is_contiguous():
        return tensor
    copy = Value(lowering.new_buf(), meta.with_shape(meta.shape))
    lines.append(_clone(tensor, copy, where))
    return Ref(copy.name)


def _clone(source: Ref, value: Value, node: str) -> KernelCall:
    contiguous = (("memory_format", Sym("memory_format", "contiguous_format")),)
    return KernelCall("clone", (source,), contiguous, (value,), f"{node} (its output)", "aten.clone.default")


def is_opaque(node: torch.fx.Node) -> bool:
    """A placeholder holding an opaque object (torch 2.13 passes each DTensor's spec beside its local
    tensor) that no node reads; one that is read is lowered, and refused, as any other input."""
    from torch._library.fake_class_registry import FakeScriptObject

    return isinstance(node.meta.get("val"), FakeScriptObject | torch.ScriptObject) and not node.users


def _arguments(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name (defaults filled in)."""
    assert isinstance(node.target, torch._ops.OpOverload)
    values: dict[str, Any] = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            values[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            values[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            values[arg.name] = arg.default_value
    return values


def group_name(value: Any, node: torch.fx.Node) -> str:
    """The group's name from the op's `group_name` (a string, or a process group object)."""
    if isinstance(value, str):
        return value
    name = getattr(value, "group_name", None)
    if isinstance(name, str):
        return name
    raise UnsupportedOpError(
        f"{NAMESPACE}.{getattr(node.target, '_opname', node.target)}", node.name,
        f"a process group given as {type(value).__name__}, not by name",
    )  # fmt: skip


def group_sizes(gm: torch.fx.GraphModule) -> tuple[tuple[str, int | None], ...]:
    """(name, size here) of each process group the graph's collectives name, sorted: part of the cache key."""
    names = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_collective_node(node) and node.target._opname != "wait_tensor":
            names.add(group_name(_arguments(node)["group_name"], node))
    return tuple((name, live_group_size(name)) for name in sorted(names))


def live_group_size(group: str) -> int | None:
    """The size of the process group named `group` in this process, where torch.distributed has one."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        return int(_resolve_process_group(group).size())
    except (RuntimeError, ValueError, KeyError):
        return None
