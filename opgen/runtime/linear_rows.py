"""A prepacked linear layer whose row count is known only per call (dynamic shapes).

`passes.prepack` replaces `addmm(b, x, W.t())` by oneDNN's `_linear_pointwise` with the weight
packed once; that is 10-40% faster from 8 rows up and about three times slower for one row. With a
static row count the pass decides at compile time; with a symbolic one the generated code calls
`linear(...)`, which decides per call from `x.shape[0]` (one Python frame, well under a microsecond,
against kernels of ten microseconds and more).
"""

from __future__ import annotations

import torch

MIN_ROWS = 8  # as passes.prepack.MIN_ROWS
_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default
_addmm = torch.ops.aten.addmm.default
_mm = torch.ops.aten.mm.default
_relu = torch.ops.aten.relu_.default
_gelu = torch.ops.aten.gelu_.default


def linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    attr: str,
    scalars: tuple[float, ...],
    algorithm: str,
    weight_t: torch.Tensor,
) -> torch.Tensor:
    """`_linear_pointwise(x, packed, bias, attr, scalars, algorithm)` from MIN_ROWS rows, else addmm/mm + activation."""
    if x.shape[0] >= MIN_ROWS:
        return _linear_pointwise(x, packed, bias, attr, scalars, algorithm)  # type: ignore[no-any-return]
    out = _mm(x, weight_t) if bias is None else _addmm(bias, x, weight_t)
    if attr == "relu":
        _relu(out)
    elif attr == "gelu":
        _gelu(out, approximate=algorithm)
    return out  # type: ignore[no-any-return]
