"""The decomposition table opgen captures with: torch's default, less the fused kernels it can call.

`torch.export.default_decompositions()` lowers everything to the core ATen op set, which takes
fused kernels apart: `scaled_dot_product_attention` becomes bmm/softmax/masking ops (losing the
flash-attention kernel eager picks on CPU and CUDA), `silu` becomes `x * sigmoid(x)`, and so on.
The ops in `KEEP_FUSED` stay whole wherever kernel_ops binds them, so the generated code calls
the same fused kernel eager calls. `scaled_dot_product_attention` is bound through its composite
kernel, which makes the same kernel choice as eager (`_fused_sdp_choice`: flash attention for
CPU; flash, memory-efficient, cuDNN or math on CUDA) for the inputs at hand. torch.compile's
graphs hold that choice already (AOT autograd expands the composite while tracing): the fused
kernels themselves (`_scaled_dot_product_flash_attention_for_cpu`; on CUDA
`_scaled_dot_product_{flash,efficient,cudnn}_attention`) are kept too, wherever a table would
take them apart.

Linear layers stay decomposed on purpose: `addmm(b, x, permute(W))` is what eager runs too, and
it is the pattern the prepack pass rewrites to oneDNN.
"""

from __future__ import annotations

from typing import Any

import torch

from opgen.runtime.registry import KernelRegistry

_aten = torch.ops.aten

# Ops with a fused ATen kernel (CPU and/or CUDA) that the default table would decompose.
KEEP_FUSED: tuple[Any, ...] = (
    _aten.scaled_dot_product_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten.silu.default,
    _aten.mish.default,
    _aten.hardswish.default,
    _aten.hardsigmoid.default,
    _aten.softplus.default,
    _aten.addcmul.default,
    _aten.baddbmm.default,
    _aten.upsample_nearest2d.default,
    _aten.upsample_bilinear2d.vec,
    _aten.upsample_nearest2d.vec,
    _aten.roll.default,  # one kernel, where the table makes an index_select per rolled dimension
    _aten.select_scatter.default,  # `buf[i] = v`: one scatter, which passes.reinplace writes in place
)


def kept_ops(registry: KernelRegistry) -> tuple[Any, ...]:
    """The ops of `KEEP_FUSED` that kernel_ops binds: those the capture leaves whole."""
    return tuple(op for op in KEEP_FUSED if registry.lookup(op.name()) is not None)


def decomposition_table(registry: KernelRegistry) -> Any:
    """torch.export's default table (a CustomDecompTable) without the kept fused ops."""
    table = torch.export.default_decompositions()
    for op in kept_ops(registry):
        table.pop(op, None)
    return table


def aot_decompositions(registry: KernelRegistry) -> dict[Any, Any]:
    """The same table as a plain dict, for aot_autograd (the torch.compile backend)."""
    table = decomposition_table(registry)
    return {op: table[op] for op in table.keys()}
