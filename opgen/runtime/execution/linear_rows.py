"""A prepacked linear layer whose row count is known only per call (dynamic shapes).

`passes.prepack` replaces `addmm(b, x, W.t())` by oneDNN's linear (`kernel_ops.mkldnn_linear_pointwise`) with the weight
packed once; that is 10-40% faster from 8 rows up and about three times slower for one row. With a
static row count the pass decides at compile time; with a symbolic one the generated code calls
`linear(...)`, which decides per call from `x.shape[0]` (one Python frame, well under a microsecond,
against kernels of ten microseconds and more). Below MIN_ROWS it writes into `scratch`, a buffer of
MIN_ROWS - 1 rows of its own call site that the program allocates once (None where the result
escapes to the caller): a product into a warm buffer through kernel_ops' out= variant takes about
11 us where the functional one through torch.ops takes 18 (768x256, one row).
"""

from __future__ import annotations

import torch

from opgen import kernel_ops

MIN_ROWS = 8  # as passes.prepack.MIN_ROWS


def linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    attr: str,
    scalars: tuple[float, ...],
    algorithm: str,
    weight_t: torch.Tensor,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """`_linear_pointwise(x, packed, bias, attr, scalars, algorithm)` from MIN_ROWS rows, else addmm/mm + activation."""
    rows = x.shape[0]
    if rows >= MIN_ROWS:
        return kernel_ops.mkldnn_linear_pointwise(x, packed, bias, attr, scalars, algorithm)  # type: ignore[no-any-return]
    if scratch is None:
        out = kernel_ops.mm(x, weight_t) if bias is None else kernel_ops.addmm(bias, x, weight_t)
    else:
        out = scratch[:rows]
        if bias is None:
            kernel_ops.mm_out(x, weight_t, out=out)
        else:
            kernel_ops.addmm_out(bias, x, weight_t, out=out)
    if attr == "relu":
        kernel_ops.relu_(out)
    elif attr == "gelu":
        kernel_ops.gelu_(out, approximate=algorithm)
    return out  # type: ignore[no-any-return]
