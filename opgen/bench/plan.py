"""`python -m opgen.bench plan`: the CUDA kernels of a decode step, planned on any machine, no GPU needed.

One family of `opgen.bench.llm_families` (real widths and bf16 by default) in transformers' static-cache
export wrapper, as `decode --families` and `step` run it, planned for CUDA by the default pipeline on
this machine (`opgen.runtime.pipeline.plan_program`): nothing runs. Planned at two and four decoder
layers, a layer's launches are half the difference and the step's own (the embedding, the positions
and mask, the head, the counters' bumps) the rest. Then the two-layer step's launches in order, each
a generated kernel (its Triton function and the report's description) or an ATen kernel that stays.

It is the count behind `docs/jit-and-fusion.md`'s table of a layer's launches family by family: to
see how far a new architecture gets the decode kernels, add it to `FAMILIES` and plan it. A GPU's
profile (`decode`'s kernels/layer, `step`'s rows) also counts the CUDA graph's copies, and its passes
ask that GPU's facts where this plan asks the CPU's (dependent launch).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from opgen.bench import leave_out
from opgen.bench.llm_families import FAMILIES, causal_lm, step
from opgen.bench.timing import format_table

LAYERS = (2, 4)  # the two plans whose difference is a layer's launches (twice)
NO_LAUNCH = frozenset({"empty", "empty_like", "empty_strided", "new_empty"})  # allocate, launch nothing


@dataclass(frozen=True, slots=True)
class Launch:
    kernel: str  # a generated kernel's Triton function, or the ATen kernel_ops name
    what: str  # the report's description of a generated kernel; "ATen" for a call that stays


@dataclass(frozen=True, slots=True)
class Plan:
    family: str
    size: str
    batch: int
    dtype: str
    per_layer: float  # launches a decoder layer
    own: int  # the step's own launches, outside its layers
    launches: tuple[Launch, ...]  # the two-layer step's, in order
    left_out: tuple[str, ...] = ()  # passes of the default pipeline not run


def planned_launches(family: str, size: str, batch: int, layers: int, dtype: torch.dtype,
                     left_out: Sequence[str] = ()) -> tuple[Launch, ...]:  # fmt: skip
    """The launches of the family's step with `layers` layers, planned for CUDA (the default pipeline without
    the passes `left_out`), in program order."""
    from opgen.runtime.capture.export import export_program, signature_of
    from opgen.runtime.passes import DEFAULT_PIPELINE
    from opgen.runtime.pipeline import default_registry, plan_program

    model = step(causal_lm(family, size, dtype=dtype, layers=layers), 64, batch)
    inputs = (torch.zeros(batch, 1, dtype=torch.long), torch.tensor([0]))
    registry = default_registry()
    with torch.no_grad():
        ep = export_program(model, inputs, registry)
        passes = leave_out.pipeline(DEFAULT_PIPELINE, left_out)
        program = plan_program(ep.graph_module, signature_of(ep), passes, "cuda:0")
    fused = {f.local: f for f in program.fused}
    found = []
    for line in program.body:
        kernel = getattr(line, "kernel", None)
        if kernel is None:
            continue  # not a call: a view line, a free, a guard, the return
        if kernel in fused:
            found.append(Launch(fused[kernel].name, fused[kernel].describe))
            continue
        info = registry.by_name.get(kernel)
        if info is None or not (info.is_view or kernel in NO_LAUNCH):
            found.append(Launch(kernel, "ATen"))
    return tuple(found)


def plan(family: str, size: str = "real", batch: int = 1, dtype: torch.dtype = torch.bfloat16,
         left_out: Sequence[str] = ()) -> Plan:  # fmt: skip
    """The family's step planned at two and four layers (without the passes `left_out`): its launches a layer,
    its own, and the two-layer step's launches in order."""
    few, more = (planned_launches(family, size, batch, n, dtype, left_out) for n in LAYERS)
    per_layer = (len(more) - len(few)) / (LAYERS[1] - LAYERS[0])
    own = round(len(few) - LAYERS[0] * per_layer)
    return Plan(family, size, batch, str(dtype).removeprefix("torch."), per_layer, own, few, tuple(left_out))


def report(p: Plan) -> str:
    head = (
        f"{p.family} ({FAMILIES[p.family].widths(p.size)}), batch {p.batch}, {p.dtype}, planned for CUDA on this "
        f"machine{leave_out.without(p.left_out)}: {p.per_layer:g} launches a layer, {p.own} of the step's own; "
        f"the {LAYERS[0]}-layer step's {len(p.launches)}:"
    )
    cells = [(i, launch.kernel, launch.what) for i, launch in enumerate(p.launches, start=1)]
    return "\n".join([head, format_table(("#", "kernel", "what"), cells)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgen.bench plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="llama", choices=sorted(FAMILIES))
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--json", help="write the plan here")
    leave_out.add_argument(parser)
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch takes a positive number")
    from opgen.runtime.passes import DEFAULT_PIPELINE

    leave_out.check(parser, args.leave_out, DEFAULT_PIPELINE)
    p = plan(args.family, args.size, args.batch, getattr(torch, args.dtype), args.leave_out)
    print(report(p))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(asdict(p), f, indent=1)
    return 0
