"""Cache writes: the `index_put_` calls that store a step's keys and values into a static KV cache, run
together as one generated Triton kernel.

A decode step writes each layer's new key and value rows into its cache buffers at the step's
position (`cache[:, :, pos] = k`: HF's `StaticCache` through `index_copy_`, gpt-fast's `KVCache`
through `index_put_`; the `reinplace` pass has made both `index_put_(cache, (None, None, pos), k)`).
ATen runs each as a general indexing kernel of several microseconds, two per layer. Here a run of
writes through one index tensor (the key and the value write of a layer, with at most views or other
calls that touch neither buffer between them) becomes one kernel: one program per block of each
write's elements loads the positions, wraps negative ones as ATen does, and stores the values into
the buffers where they are.

A position out of the buffer's range writes nothing (eager stops with a device-side assertion
instead). The kernel is a `FusedKernel` that writes its inputs in place and returns nothing, bound
like the other generated kernels: a multi-kernel choice against the `index_put_` calls it replaced,
timed on the first call (on copies of the buffers). CUDA, static sizes, one index tensor per write,
values of the buffer's dtype that broadcast to the written region (as ATen's do).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from opgen.runtime.ir import FusedKernel, KernelCall, Program, Ref, TensorMeta, Value, meta_table, uses
from opgen.runtime.passes.analysis import fresh_namer, writes_memory
from opgen.runtime.passes.fusion.cache_writes_triton import configs, kernel
from opgen.runtime.passes.fusion.calls import place
from opgen.runtime.registry import KernelRegistry

INDEX_PUT = "index_put_"
DTYPES = ("float16", "bfloat16", "float32")
INDEX_DTYPES = ("int64", "int32")


@dataclass(frozen=True, slots=True)
class Write:
    """`index_put_(dst, (None,) * dim + (index,), values)`: values go to dst at index along dim."""

    at: int  # in the body
    line: KernelCall
    dst: str
    values: str
    dim: int
    dst_meta: TensorMeta
    values_meta: TensorMeta
    region: tuple[int, ...]  # what is written: dst's shape with the index's length along dim
    values_stride: tuple[int, ...]  # the values' strides over the region (0 where they broadcast)


@dataclass(frozen=True, slots=True)
class Writes:
    """Consecutive writes through one index tensor: one kernel."""

    index: str
    index_meta: TensorMeta
    writes: tuple[Write, ...]


def fuse_cache_writes(program: Program, registry: KernelRegistry) -> Program:
    found = list(find_writes(program))
    if not found:
        return program
    locals_ = fresh_namer(program, "cache_write")
    placed = [(fused_kernel(run, next(locals_)), [w.at for w in run.writes], run.writes[-1].at) for run in found]
    return place(program, placed)


def find_writes(program: Program) -> Iterator[Writes]:
    """Runs of cache writes through one index tensor, in body order. The kernel takes the last write's
    place, so the lines between the writes (views, the values' own computation) may neither write
    memory nor read a buffer of the run: they would see a write too late."""
    metas = meta_table(program)
    run: list[Write] = []
    index: str | None = None
    for at, line in enumerate(program.body):
        found = _write(at, line, metas) if isinstance(line, KernelCall) else None
        if found is not None and run and (found[0] != index or not _independent(run, found[1])):
            yield Writes(index, metas[index], tuple(run))  # type: ignore[arg-type]
            run = []
        if found is not None:
            index = found[0]
            run.append(found[1])
        elif run and (writes_memory(line) or not {w.dst for w in run}.isdisjoint(uses(line))):
            yield Writes(index, metas[index], tuple(run))  # type: ignore[arg-type]
            run = []
    if run:
        yield Writes(index, metas[index], tuple(run))  # type: ignore[arg-type]


def _independent(run: list[Write], write: Write) -> bool:
    """`write` neither writes a buffer of the run again nor reads one the run writes (and the run
    reads nothing it writes)."""
    written = {w.dst for w in run}
    return not {write.dst, write.values} & written and all(write.dst != w.values for w in run)


def _write(at: int, line: KernelCall, metas: dict[str, TensorMeta]) -> tuple[str, Write] | None:
    """(index name, the write) where the line is a cache write the kernel can run."""
    if line.kernel != INDEX_PUT or line.fallback or line.jit or line.outputs or not 3 <= len(line.args) <= 4:
        return None
    dst, indices, values, *accumulate = line.args
    if accumulate not in ([], [False]) or dict(line.kwargs).get("accumulate", False) is not False:
        return None
    if not isinstance(dst, Ref) or not isinstance(values, Ref) or not isinstance(indices, tuple):
        return None
    if line.mutates != (dst.name,) or not indices or not isinstance(indices[-1], Ref):
        return None
    if any(i is not None for i in indices[:-1]):
        return None
    dim, index = len(indices) - 1, indices[-1].name
    dm, vm, im = metas.get(dst.name), metas.get(values.name), metas.get(index)
    if dm is None or vm is None or im is None or not all(m.is_static for m in (dm, vm, im)):
        return None
    if not dm.device.startswith("cuda") or {vm.device, im.device} != {dm.device} or dim >= len(dm.shape):
        return None
    if dm.dtype not in DTYPES or vm.dtype != dm.dtype or im.dtype not in INDEX_DTYPES or len(im.shape) != 1:
        return None
    region = (*dm.shape[:dim], im.shape[0], *dm.shape[dim + 1 :])
    stride = _broadcast(vm, region)  # type: ignore[arg-type]
    if stride is None:
        return None
    return index, Write(at, line, dst.name, values.name, dim, dm, vm, region, stride)  # type: ignore[arg-type]


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


def fused_kernel(run: Writes, local: str) -> FusedKernel:
    writes = run.writes
    name, source = kernel(run)
    inputs = (run.index, *(n for w in writes for n in (w.dst, w.values)))
    dtypes = (run.index_meta.dtype, *(m.dtype for w in writes for m in (w.dst_meta, w.values_meta)))
    shapes = ", ".join("x".join(map(str, w.region)) for w in writes)
    return FusedKernel(
        local=local,
        name=name,
        source=source,
        inputs=inputs,
        input_dtypes=dtypes,
        outputs=(),
        configs=configs(run),
        nodes=tuple(w.line.node for w in writes),
        describe=f"cache write kernel, {len(writes)} write(s) at {run.index_meta.shape[0]} position(s): {shapes}",
        lines=tuple(w.line for w in writes),
        writes=tuple(Value(w.dst, w.dst_meta) for w in writes),
    )
