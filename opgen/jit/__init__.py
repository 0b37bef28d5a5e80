"""opgen.jit: Triton kernels launched directly from C++ (see README, "JIT kernels")."""
