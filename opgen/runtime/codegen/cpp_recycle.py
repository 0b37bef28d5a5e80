"""Which results the C++ function may write into the caller's dropped last result (`recycle` lines).

A returned value made by a functional CPU kernel with a plain out= variant (`add` -> `add_out`,
the same arguments and `out`) gets that out= form after its line in the program text. The C++
function (csrc/opgen/module/executor_py.cpp) keeps each such result it returned; when the next call
finds that nothing but the function reaches it any more (no other reference to the object, no
weak reference, no attribute, no view or other tensor on its storage, no grad, the same dtype,
sizes and strides), the program writes the new value into it with the out= form instead of
allocating one. So a caller that drops each result before the next call, as inference loops do,
costs no allocation, no tensor object and no free per result. CPU only: on CUDA a dropped tensor
may still be read by work on another stream, and the caching allocator already reuses memory in
stream order.
"""

from __future__ import annotations

from collections import Counter

from opgen.runtime.codegen.registry_view import KernelRegistry
from opgen.runtime.ir import ITEMSIZE, KernelCall, Program, Ref, Return, producers, writing_into


def recyclable(program: Program, registry: KernelRegistry) -> dict[str, tuple[int, KernelCall]]:
    """Returned value name -> (its index in the return line, the out= form of the line that makes it)."""
    ret = next((line for line in reversed(program.body) if isinstance(line, Return)), None)
    if ret is None:
        return {}
    returned = Counter(v.name for v in ret.values if isinstance(v, Ref))
    inputs = {i.name for i in program.inputs}
    makers = producers(program.body)
    out: dict[str, tuple[int, KernelCall]] = {}
    for k, value in enumerate(ret.values):
        if not isinstance(value, Ref) or returned[value.name] != 1 or value.name in inputs:
            continue
        line = makers.get(value.name)
        form = _out_form(line, registry) if line is not None and len(line.outputs) == 1 else None
        if form is not None:
            out[value.name] = (k, form)
    return out


def _out_form(line: KernelCall, registry: KernelRegistry) -> KernelCall | None:
    """`line` writing its result into `out=`, where that is the same kernel family's plain out= variant."""
    out = line.outputs[0]
    if line.fallback or line.jit or line.unpack or out is None or out.meta is None:
        return None
    meta = out.meta
    if not meta.is_static or meta.device != "cpu" or meta.dtype not in ITEMSIZE or meta.offset != 0:
        return None
    info = registry.by_name.get(line.kernel)
    if info is None or info.variant != "functional" or info.is_view:
        return None
    variant = registry.plain_out(line.kernel)
    return writing_into(line, variant.name, out.name) if variant is not None else None
