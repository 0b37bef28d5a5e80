"""A product kernel that ends with the pointwise group reading its product (`GemvPlan.epilogue`,
`passes.fusion.gemv_epilogue`): where the one-row, prologue and few-row kernels store their product,
they store the group's output instead, computed from the product in registers (`group_parts.pointwise_epilogue`).

Their helpers' sources mark where that goes: `@E@` after the input parameter(s) of the signature (the
group's other inputs, `e_in<i>`), and `@STORE@` for the value stored. `finish` fills both.
"""

from __future__ import annotations

from opgen.runtime.codegen.triton.group_parts import epilogue_params, pointwise_epilogue
from opgen.runtime.ir import GemvPlan


def parameters(plan: GemvPlan) -> list[str]:
    """The kernel's parameters for the group's other inputs (after the products' input): `e_in<i>`."""
    if plan.epilogue is None:
        return []
    return [f"e_{p}" for p in epilogue_params(plan.epilogue, plan.epilogue_y)]


def finish(helper: str, plan: GemvPlan, value: str, offs: str, mask: str) -> str:
    """`helper` with its marks filled, and the group's function before it where there is an epilogue: the
    store of `value` (float32) at the output's flat indices `offs` under `mask` becomes the group's output
    there."""
    if plan.epilogue is None:
        return helper.replace("@E@", "").replace("@STORE@", f"{value}.to(out.dtype.element_ty)")
    source = pointwise_epilogue(plan.epilogue, plan.epilogue_y)
    given = parameters(plan)
    stored = f"_epilogue({', '.join([*given, value, offs, mask])})"
    return source + "\n\n" + helper.replace("@E@", "".join(f", {p}" for p in given)).replace("@STORE@", stored)
