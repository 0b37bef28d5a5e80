"""Lowering: an ATen-level FX graph -> a wrapper IR `Program` (values, sizes, user Triton kernels)."""
