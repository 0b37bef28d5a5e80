"""The hand-written C++ loop the C++ backend is held to: `at::cpu::add` called from C++, no Python between calls.

`graphs`' candidate `cpp_loop`, for single_add and reshape_add only: the kernel calls opgen's program
for the case makes, written by hand in a loop, with the kernel's output allocated and freed each
time (a call of the C++ function from Python writes into the result the caller dropped instead:
docs/runtime.md, "Results are recycled"). For both cases that is one `at::cpu::add` (reshape_add's reshapes are
gone from opgen's program: `sink_reshapes` runs the add on the vectors). A candidate call runs `LOOP`
iterations through ctypes (a ctypes call costs about 1 us, a thousandth of an iteration each), and
`graphs` divides its times by `LOOP`. The last iteration's result is copied out, so its error is
checked like any candidate's.

The library is built once per torch version with torch's extension builder, from narrow headers
(about 20 s on the CPU machine), in the system's temporary folder.
"""

from __future__ import annotations

import ctypes
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LOOP = 1000  # iterations per candidate call
CASES = ("single_add", "reshape_add")
NAME = "opgen_bench_cpp_loop"
SOURCE = r"""// opgen's graph benchmark: the hand-written C++ loop (opgen/bench/cpp_loop.py).
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>

#include <cstdint>
#include <cstring>

extern "C" void opgen_add_loop(float* x, float* y, float* out, int64_t n, int64_t iters) {
  auto options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor a = at::from_blob(x, {n}, options);
  at::Tensor b = at::from_blob(y, {n}, options);
  at::Tensor result;
  for (int64_t i = 0; i < iters; ++i) {
    result = at::cpu::add(a, b);
  }
  std::memcpy(out, result.data_ptr<float>(), n * sizeof(float));
}
"""


def applies(case: str) -> bool:
    return case in CASES


def missing() -> str | None:
    """Why the loop cannot be built here (no ninja, no compiler, a failed build), or None."""
    try:
        _library()
    except Exception as exc:  # torch's builder raises RuntimeError, OSError, subprocess errors...
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    return None


def build(case: str, inputs: tuple[torch.Tensor, ...]) -> Callable[[], torch.Tensor]:
    """A call of `LOOP` iterations of the case's kernel calls on `inputs`; it returns the last result."""
    x, y = (t.contiguous() for t in inputs)
    if case not in CASES or x.dtype != torch.float32 or x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"cpp_loop: {case} is not one add of two float32 vectors of one length")
    out = torch.empty_like(x)
    loop = _library().opgen_add_loop
    args = (_float_ptr(x), _float_ptr(y), _float_ptr(out), x.numel(), LOOP)
    return functools.partial(_run, loop, args, out, (x, y))


def _run(loop: Any, args: tuple[Any, ...], out: torch.Tensor, keep: tuple[torch.Tensor, ...]) -> torch.Tensor:
    loop(*args)  # `keep` holds the inputs the pointers point into
    return out


def _float_ptr(t: torch.Tensor) -> Any:
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))


@functools.cache
def _library() -> ctypes.CDLL:
    from torch.utils import cpp_extension

    folder = Path(tempfile.gettempdir()) / f"{NAME}-{torch.__version__}"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "loop.cpp"
    if not source.is_file() or source.read_text() != SOURCE:
        source.write_text(SOURCE)
    cpp_extension.load(
        name=NAME, sources=[str(source)], build_directory=str(folder), is_python_module=False, extra_cflags=["-O2"]
    )
    library = ctypes.CDLL(str(folder / f"{NAME}.so"))
    library.opgen_add_loop.restype = None
    library.opgen_add_loop.argtypes = [ctypes.POINTER(ctypes.c_float)] * 3 + [ctypes.c_int64, ctypes.c_int64]
    return library
