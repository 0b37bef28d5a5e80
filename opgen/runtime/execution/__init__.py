"""Execution: an artifact -> a callable (`executor`), the input check (`guards`, `dynamic_guards`),
specializations (`size_classes`, `automatic`), CUDA-graph mode (`cuda_graphs`), and what generated code
calls at run time beyond kernel_ops (`fused`, `linear_rows`, `source_lines`)."""
