"""GPU fusion: which graph nodes run as one generated Triton kernel. Decisions only: each pass here leaves
a `FusedKernel` holding its plan (`opgen.runtime.ir.plans`), and `opgen.runtime.codegen.triton` prints
the kernels' sources once the passes have run.

Groups of pointwise nodes and row reductions: `steps` (what one node becomes, by the op rules of
`opgen.runtime.ir.fusible`), `groups` (which nodes run together), `placement` (outputs stored through
the copies that move them), `expressible` (whether the printer can write the group), `rewrite` (the
pass). The other kernels, one module each: `gemv` (with `gemv_gated`), `attention`, `cache_writes`,
`spatial_mean`; `bias` and `lift_views` reshape the graph so that more nodes fuse; `calls` puts a
kernel's call into the body. Binding the kernels at load time is `opgen.runtime.execution.fused`."""
