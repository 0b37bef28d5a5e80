"""The Triton backend: the source of every kernel a pass plans (`opgen.runtime.ir.plans`).

`kernels.print_kernels` runs after the passes and prints each `FusedKernel`'s plan with the printer of
its kind: `groups` (pointwise and row kernels of fusion groups, with `ops`, the expression of each
fusible ATen overload, `order` and `placement`), `gemv`, `attention`, `cache_writes` and `spatial_mean`;
`module` is the module text they share and `dependent_launch` the wait a kernel starts with where
kernels launch dependently. Text only: it imports the IR and nothing else.
"""
