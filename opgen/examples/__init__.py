"""Example projects shipped with opgen, and the code that builds them.

`user_kernels/`: a CMake project of your own kernels (docs/spec.md, "Your own kernels"): a C++ kernel (and,
in CUDA builds, a CUDA one) bound by opgen as `my_ops.kernel_ops.scaled_add` and registered with
torch.library as `torch.ops.mylib.scaled_add`. `build_user_kernels(build_dir)` builds it.
"""

from opgen.examples.build import USER_KERNELS, ExampleBuildError, build_user_kernels, default_build_dir

__all__ = ["USER_KERNELS", "ExampleBuildError", "build_user_kernels", "default_build_dir"]
