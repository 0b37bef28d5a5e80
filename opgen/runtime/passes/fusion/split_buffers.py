"""Working memory of a kernel that splits one output's work among programs (the decode-attention kernel
over a long cache): a float32 buffer for the programs' partial results and a zeroed int32 counter per
output block, both made once in setup. In each launch the programs of a block
write their partials and take a ticket from its counter; the last sums them and sets the counter back
to zero, so the buffers are fit for the next launch with no kernel to clear them. The kernel lists both
among its inputs and its `writes`: they are persistent buffers (a program with them runs one call at a
time), and the choice's timing runs on copies of them.
"""

from __future__ import annotations

from opgen.runtime.ir import Alloc, KernelCall, Sym, TensorMeta, Value


def split_buffers(name: str, partials: int, counters: int, device: str, node: str) -> tuple[Alloc, KernelCall]:
    """Setup's lines for `<name>_part` (`partials` float32, uninitialised) and `<name>_count` (`counters`
    int32 zeros)."""
    part = Value(f"{name}_part", TensorMeta((partials,), (1,), "float32", device))
    count = Value(f"{name}_count", TensorMeta((counters,), (1,), "int32", device))
    zeros = KernelCall("zeros", ((counters,),), (("dtype", Sym("dtype", "int32")), ("device", Sym("device", device))),
                       (count,), node, "aten.zeros.default", fresh=True)  # fmt: skip
    return Alloc(part), zeros


def written(buffers: tuple[Alloc, KernelCall] | tuple[()]) -> tuple[Value, ...]:
    """The buffers as the kernel's written inputs (part, then count); none without them."""
    if not buffers:
        return ()
    part, zeros = buffers
    count = zeros.outputs[0]
    assert count is not None
    return part.value, count
