"""Cache writes: the `index_put_` calls that store a step's keys and values into a static KV cache, and
the `copy_` calls that set small buffers, run together as one generated Triton kernel.

A decode step writes each layer's new key and value rows into its cache buffers at the step's
position (`cache[:, :, pos] = k`: HF's `StaticCache` through `index_copy_`, gpt-fast's `KVCache`
through `index_put_`; the `reinplace` pass has made both `index_put_(cache, (None, None, pos), k)`).
ATen runs each as a general indexing kernel of several microseconds, two per layer. Here a run of
writes through one index tensor (the key and the value write of a layer, with at most views or other
calls that touch neither buffer between them) becomes one kernel: one program per block of each
write's elements loads the positions, wraps negative ones as ATen does, and stores the values into
the buffers where they are. A run of `copy_` calls into buffers (HF's cache sets each layer's
position counter from `cache_position` at the top of the step) becomes one kernel the same way, as
does a run of two or more updates of buffers by a number (`add_(counter, 1)`: HF's cache bumps each
counter after its layer's write; `sink_updates` has moved the bumps to the end of the step, one after
another).

Where the positions are computed just before by an `add` of two integer tensors that nothing else
reads (HF's cache: `arange(n) + counter`), the kernel computes the sum itself, and takes the add's
place: the writes move up over the lines between, which must neither touch the buffers written nor
write what the writes read (the counter's own increment may sit there: the sum reads it before).

A position out of the buffer's range writes nothing (eager stops with a device-side assertion
instead). The kernel is a `FusedKernel` that writes its inputs in place and returns nothing, its plan
(`CacheWritePlan`) printed by `codegen.triton.cache_writes`, bound
like the other generated kernels: a multi-kernel choice against the calls it replaced, timed on the
first call (on copies of the buffers). CUDA, static sizes, one index tensor per write, values of the
buffer's dtype (a copy may change one floating type to another) that broadcast to the written region.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from opgen.runtime.ir import (
    CacheWritePlan,
    FusedKernel,
    KernelCall,
    Line,
    Program,
    Ref,
    RegionWrite,
    TensorMeta,
    Value,
    meta_table,
    uses,
)
from opgen.runtime.passes.analysis import Groups, alias_groups, defined_at, fresh_namer, readers, writes_memory
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.passes.sink_updates import is_update
from opgen.runtime.registry import KernelRegistry

INDEX_PUT, COPY, ADD = "index_put_", "copy_", "aten.add.Tensor"
FLOATS = ("float16", "bfloat16", "float32")
DTYPES = (*FLOATS, "int32", "int64")
INDEX_DTYPES = ("int64", "int32")


@dataclass(frozen=True, slots=True)
class Write:
    """`index_put_(dst, (None,) * dim + (index,), values)`: values go to dst at index along dim; or,
    with `dim` None, `copy_(dst, values)`."""

    at: int  # in the body
    line: KernelCall
    dst: str
    values: str
    dim: int | None
    dst_meta: TensorMeta
    values_meta: TensorMeta
    region: tuple[int, ...]  # what is written: dst's shape, with the index's length along dim
    values_stride: tuple[int, ...]  # the values' strides over the region (0 where they broadcast)
    plus: int | float | None = None  # an update `add_(dst, plus)`: the values are dst itself


@dataclass(frozen=True, slots=True)
class Positions:
    """Where the positions come from: the index tensor, or the terms of the `add` that computed it."""

    terms: tuple[tuple[str, TensorMeta, int], ...]  # (value, meta, stride along the positions: 0 broadcasts)
    length: int
    add: int | None = None  # body index of the add the kernel computes instead


@dataclass(frozen=True, slots=True)
class Writes:
    """Writes run as one kernel (through one index tensor, or copies), and where its call goes."""

    positions: Positions | None  # None: copies
    writes: tuple[Write, ...]
    at: int

    @property
    def plan(self) -> CacheWritePlan:
        """What the kernel computes: each write's region, and the strides of the positions' terms."""
        writes = tuple(RegionWrite(w.region, w.dst_meta, w.dim, w.values_stride, w.plus) for w in self.writes)
        if self.positions is None:
            return CacheWritePlan(writes, None)
        strides = tuple(stride for _, _, stride in self.positions.terms)
        return CacheWritePlan(writes, strides, self.positions.length, self.positions.add is not None)

    @property
    def members(self) -> list[int]:
        adds = [self.positions.add] if self.positions is not None and self.positions.add is not None else []
        return [*adds, *(w.at for w in self.writes)]


def fuse_cache_writes(program: Program, registry: KernelRegistry) -> Program:
    # A lone update stays ATen's: a kernel of its own would save no launch.
    found = [run for run in find_writes(program, registry) if len(run.writes) > 1 or run.writes[0].plus is None]
    if not found:
        return program
    locals_ = fresh_namer(program, "cache_write")
    return place(program, [(fused_kernel(run, next(locals_), program.body), run.members, run.at) for run in found])


def find_writes(program: Program, registry: KernelRegistry) -> Iterator[Writes]:
    """Runs of writes (through one index tensor, or copies), in body order. The kernel takes the last
    write's place, so the lines between the writes (views, the values' own computation) may neither
    write memory nor read a buffer of the run: they would see a write too late."""
    metas = meta_table(program)
    body = program.body
    producers, read_by = defined_at(body), readers(body)
    storage = alias_groups(body, registry)
    run: list[Write] = []
    index: str | None = None

    def done() -> Writes:
        found = Writes(_positions(index, metas), tuple(run), run[-1].at)
        return _with_positions(found, body, metas, producers, read_by, storage)

    for at, line in enumerate(body):
        found = _write(at, line, metas) if isinstance(line, KernelCall) else None
        if found is not None and run and (found[0] != index or not _independent(run, found[1])):
            yield done()
            run = []
        if found is not None:
            index = found[0]
            run.append(found[1])
        elif run and (writes_memory(line) or not {w.dst for w in run}.isdisjoint(uses(line))):
            yield done()
            run = []
    if run:
        yield done()


def _positions(index: str | None, metas: dict[str, TensorMeta]) -> Positions | None:
    if index is None:
        return None
    meta = metas[index]
    return Positions(((index, meta, int(meta.stride[0])),), int(meta.shape[0]))  # type: ignore[arg-type]


def _independent(run: list[Write], write: Write) -> bool:
    """`write` neither writes a buffer of the run again nor reads one the run writes (and the run
    reads nothing it writes)."""
    written = {w.dst for w in run}
    return not {write.dst, write.values} & written and all(write.dst != w.values for w in run)


def _with_positions(run: Writes, body: Sequence[Line], metas: dict[str, TensorMeta], producers: dict[str, int],
                    read_by: dict[str, set[int]], storage: Groups) -> Writes:  # fmt: skip
    """The run computing its positions itself, where an `add` of two integer tensors made them for it
    alone and the writes can move up to the add (see the module's docstring); else the run as it is."""
    if run.positions is None or len(run.positions.terms) != 1:
        return run
    index = run.positions.terms[0][0]
    add = producers.get(index)
    line = body[add] if add is not None else None
    if not isinstance(line, KernelCall) or line.target != ADD or line.kwargs or len(line.args) != 2:
        return run
    if not all(isinstance(a, Ref) for a in line.args) or read_by.get(index) != {w.at for w in run.writes}:
        return run
    terms = []
    for arg in line.args:
        meta = metas.get(arg.name)  # type: ignore[union-attr]
        if meta is None or meta.dtype not in INDEX_DTYPES or len(meta.shape) > 1 or not meta.is_static:
            return run
        size = int(meta.shape[0]) if meta.shape else 1  # type: ignore[arg-type]
        if size not in (1, run.positions.length):
            return run
        terms.append((arg.name, meta, 0 if size == 1 else int(meta.stride[0])))  # type: ignore[union-attr,arg-type]
    if any(producers.get(n, -1) > add for w in run.writes for n in (w.dst, w.values)):
        return run  # a write's values come after the add: the writes cannot move up to it
    if {name for name, _, _ in terms} & {w.dst for w in run.writes}:
        return run  # positions read from a buffer the run writes
    if not _movable(run, body, add, storage):
        return run
    return replace(run, positions=replace(run.positions, terms=tuple(terms), add=add), at=add)


def _movable(run: Writes, body: Sequence[Line], add: int, storage: Groups) -> bool:
    """Each write can move up to the add: the lines it passes neither read the buffers the run
    writes nor write what it writes or reads (anything sharing their storage included)."""
    written = {storage.find(w.dst) for w in run.writes}
    touched = written | {storage.find(w.values) for w in run.writes}
    members = {w.at for w in run.writes}
    for at in range(add + 1, run.writes[-1].at):
        line = body[at]
        if at in members:
            continue
        if {storage.find(n) for n in uses(line)} & written:
            return False
        if isinstance(line, KernelCall) and (line.fallback or line.jit):
            return False
        if isinstance(line, KernelCall) and {storage.find(n) for n in line.mutates} & touched:
            return False
    return True


def _write(at: int, line: KernelCall, metas: dict[str, TensorMeta]) -> tuple[str | None, Write] | None:
    """(index name, or None for a copy; the write) where the line is a write the kernel can run."""
    if line.fallback or line.jit or line.outputs or not line.args or not isinstance(line.args[0], Ref):
        return None
    dst = line.args[0].name
    if line.mutates != (dst,):
        return None
    plus = None
    if line.kernel == COPY and 2 <= len(line.args) <= 3 and not line.kwargs and isinstance(line.args[1], Ref):
        index, dim, values = None, None, line.args[1].name
    elif is_update(line):  # `add_(dst, number)`: a copy of dst plus the number into itself
        index, dim, values, plus = None, None, dst, line.args[1]
    elif line.kernel == INDEX_PUT and 3 <= len(line.args) <= 4:
        _, indices, value, *accumulate = line.args
        if accumulate not in ([], [False]) or dict(line.kwargs).get("accumulate", False) is not False:
            return None
        if not isinstance(value, Ref) or not isinstance(indices, tuple) or not indices:
            return None
        if not isinstance(indices[-1], Ref) or any(i is not None for i in indices[:-1]):
            return None
        index, dim, values = indices[-1].name, len(indices) - 1, value.name
    else:
        return None
    dm, vm = metas.get(dst), metas.get(values)
    im = metas.get(index) if index is not None else dm
    if dm is None or vm is None or im is None or not all(m.is_static for m in (dm, vm, im)):
        return None
    if not dm.device.startswith("cuda") or {vm.device, im.device} != {dm.device} or dm.dtype not in DTYPES:
        return None
    if vm.dtype != dm.dtype and not (index is None and {vm.dtype, dm.dtype} <= set(FLOATS)):
        return None
    if isinstance(plus, float) and dm.dtype not in FLOATS:
        return None  # an integer buffer plus a float: ATen's promotion rules, not a cast of the sum
    if dim is None:
        region = tuple(dm.shape)
    elif dim >= len(dm.shape) or im.dtype not in INDEX_DTYPES or len(im.shape) != 1:
        return None
    else:
        region = (*dm.shape[:dim], im.shape[0], *dm.shape[dim + 1 :])
    stride = _broadcast(vm, region)  # type: ignore[arg-type]
    if stride is None:
        return None
    return index, Write(at, line, dst, values, dim, dm, vm, region, stride, plus)  # type: ignore[arg-type]


def _broadcast(values: TensorMeta, region: tuple[int, ...]) -> tuple[int, ...] | None:
    """The values' strides over the region they are written to, as ATen broadcasts them (None: they
    do not broadcast to it)."""
    if len(values.shape) > len(region):
        return None
    pad = len(region) - len(values.shape)
    strides = []
    for size, (have, stride) in zip(
        region, [(1, 0)] * pad + list(zip(values.shape, values.stride, strict=True)), strict=True
    ):
        if have == size:
            strides.append(0 if size == 1 else int(stride))
        elif have == 1:
            strides.append(0)
        else:
            return None
    return tuple(strides)


def fused_kernel(run: Writes, local: str, body: Sequence[Line]) -> FusedKernel:
    writes, plan = run.writes, run.plan
    terms = run.positions.terms if run.positions is not None else ()
    pairs = [((w.dst, w.dst_meta),) if w.plus is not None else ((w.dst, w.dst_meta), (w.values, w.values_meta))
             for w in writes]  # an update reads the buffer it writes: one parameter  # fmt: skip
    inputs = (*(t[0] for t in terms), *(name for pair in pairs for name, _ in pair))
    dtypes = (*(t[1].dtype for t in terms), *(meta.dtype for pair in pairs for _, meta in pair))
    shapes = ", ".join("x".join(map(str, w.region)) or "scalar" for w in writes)
    lines = [body[i] for i in run.members]
    return FusedKernel.make(
        local,
        plan,
        inputs=zip(inputs, dtypes, strict=True),
        outputs=(),
        nodes=(line.node for line in lines),  # type: ignore[union-attr]
        describe=f"cache write kernel, {plan.what}: {shapes}",
        lines=lines,  # type: ignore[arg-type]
        writes=(Value(w.dst, w.dst_meta) for w in writes),
    )
