"""The Triton source of a cache-write kernel (a `CacheWritePlan` of `opgen.runtime.passes.fusion.cache_writes`).

Programs are laid out write after write (the first write's blocks, then the second's, ...). A program
takes BLOCK elements of the region its write fills (the values broadcast to it), splits each
element's flat number into its coordinates (sizes are literals), loads the position its coordinate
along the written dimension picks from the index tensor, and stores the value into the buffer there.
Names of graph values never appear, so a model's layers share one kernel.
"""

from __future__ import annotations

import math
from typing import Any

from opgen.runtime.codegen.triton.module import jit_module, next_power_of_2
from opgen.runtime.ir import CacheWritePlan, Config, RegionWrite

BLOCKS = ((256, 2), (1024, 4))  # (elements per program, warps)
INT32_MAX = 2**31 - 1


def kernel(plan: CacheWritePlan) -> tuple[str, str]:
    """(name, source): parameters the positions' terms (`index0`, and `index1` where the kernel adds
    two), then each write's buffer and values (`dst0, values0, ...`; an update's buffer alone)."""
    writes, terms = plan.writes, plan.positions or ()
    params = [
        *(f"index{t}" for t in range(len(terms))),
        *(f"{p}{i}" for i, w in enumerate(writes) for p in (("dst",) if w.plus is not None else ("dst", "values"))),
    ]
    body = [f"    # {plan.what}", "    pid = tl.program_id(0)"]
    start = ""
    for i, write in enumerate(writes):
        blocks = f"({_numel(write.region)} + BLOCK - 1) // BLOCK"
        end = f"{start} + {blocks}" if start else blocks
        lines = _write_lines(write, i, f"pid - ({start})" if start else "pid", terms)
        if len(writes) == 1:
            body += [f"    {line}" for line in lines]
        else:
            test = "else:" if i == len(writes) - 1 else f"{'if' if i == 0 else 'elif'} pid < {end}:"
            body += [f"    {test}", *(f"        {line}" for line in lines)]
        start = end
    return jit_module("cache_write", params, "BLOCK: tl.constexpr", "\n".join(body))


def _write_lines(write: RegionWrite, i: int, block: str, terms: tuple[int, ...]) -> list[str]:
    """One program's share of write `i`: the element's coordinates, its position, the store; `terms`:
    the positions' terms' strides."""
    shape, dst = write.region, write.dst
    wide = _numel(dst.shape) + dst.offset > INT32_MAX or _numel(shape) > INT32_MAX
    along = f" along dim {write.dim}" if write.dim is not None else ""
    lines = [
        f"# {'x'.join(map(str, shape))} into {'x'.join(map(str, dst.shape))}{along}",
        f"e = ({block}) * BLOCK + tl.arange(0, BLOCK)" + (".to(tl.int64)" if wide else ""),
        f"ok = e < {_numel(shape)}",
    ]
    coords: dict[int, str] = {}
    rest = "e"
    for d in reversed(range(len(shape))):
        if shape[d] == 1:
            continue
        inner = [x for x in range(d) if shape[x] != 1]
        if inner:
            lines.append(f"c{d} = {rest} % {shape[d]}")
            lines.append(f"r{d} = {rest} // {shape[d]}")
            rest = f"r{d}"
        else:
            lines.append(f"c{d} = {rest}")
        coords[d] = f"c{d}"
    target = dict(coords)
    if write.dim is not None:
        at = coords.get(write.dim, "e * 0")  # one position: every element reads it
        size = dst.shape[write.dim]
        loads = [f"tl.load(index{t} + {at} * {stride}, mask=ok, other=0)" if stride else
                 f"tl.load(index{t} + e * 0, mask=ok, other=0)" for t, stride in enumerate(terms)]  # fmt: skip
        lines += [
            f"p = {' + '.join(loads)}",
            f"p = tl.where(p < 0, p + {size}, p)",
            f"ok = ok & (p >= 0) & (p < {size})",
        ]
        target[write.dim] = "p"
    source = "values" if write.plus is None else "dst"  # an update reads the buffer it writes
    lines.append(f"x = tl.load({source}{i} + {_offset(coords, write.values_stride)}, mask=ok)")
    if write.plus is not None:
        lines.append(f"x = x + {write.plus!r}")
    lines.append(f"tl.store(dst{i} + {_offset(target, dst.stride)}, x.to(dst{i}.dtype.element_ty), mask=ok)")
    return lines


def _offset(coords: dict[int, str], stride: tuple[Any, ...]) -> str:
    terms = [f"{c} * {stride[d]}" for d, c in sorted(coords.items()) if stride[d] != 0]
    return " + ".join(terms) or "e * 0"  # one element: every program's lanes address it


def _numel(shape: tuple[Any, ...]) -> int:
    return math.prod(int(n) for n in shape)


def configs(plan: CacheWritePlan) -> tuple[Config, ...]:
    largest = max(_numel(w.region) for w in plan.writes)
    fits = max(32, next_power_of_2(largest))  # the smallest power of two >= it (at least 32)
    found: list[Config] = []
    for block, warps in BLOCKS:
        block = min(block, fits)
        grid = (sum(-(-_numel(w.region) // block) for w in plan.writes),)
        config: Config = ((("BLOCK", block),), warps, 1, grid)
        if config not in found:
            found.append(config)
    return tuple(found)
