"""GPU fusion: which graph nodes run as one generated Triton kernel (`groups`), what each node computes
there (`ops`), and the kernel's source (`triton`, the Triton backend). The pass that applies them is
`opgen.runtime.passes.fusion.rewrite`; binding the kernels at load time is `opgen.runtime.execution.fused`."""
