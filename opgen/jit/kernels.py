"""`JitKernel`: one Triton function with its grid and configs, and the C++ launcher that runs it.

The launcher (`opgen._C.JitLauncher`) is what callers hold: a call launches the first compiled
variant whose specialization fits the arguments, with no Python in between. Only a call that no
variant fits reaches `JitKernel._first_fit`, which specializes for those arguments, waits for (or
starts) their compilation, autotunes when there are several configs, adds the variant and launches.
`warmup()` starts that compilation in the background ahead of the first call.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from opgen.jit import autotune, compiler, env, expr, forcing
from opgen.jit.binary import KernelBinary
from opgen.jit.errors import JitError
from opgen.jit.specialize import Specialization, runtime_params, specialize

Grid = Any  # an int, a tuple of ints/expression strings, or a function of the meta-parameters


@dataclass(frozen=True, slots=True)
class Config:
    """Constexpr values and launch options of one variant to try."""

    meta: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3

    @property
    def options(self) -> compiler.Options:
        return compiler.Options(self.num_warps, self.num_stages)

    def describe(self) -> str:
        meta = ", ".join(f"{k}={v}" for k, v in self.meta.items())
        return f"{meta}{', ' if meta else ''}num_warps={self.num_warps}, num_stages={self.num_stages}"


class JitKernel:
    def __init__(
        self,
        fn: Any,
        grid: Grid,
        configs: Sequence[Config] = (Config(),),
        mutates: Sequence[str] | None = None,
        name: str | None = None,
        dependent_launch: bool = False,
        native: Any = None,
    ) -> None:
        """`dependent_launch`: launch with programmatic dependent launch (CUDA, compute capability 9.0
        and newer), so that the kernel starts while the one before it finishes; `fn` must wait for it
        (`tl.extra.cuda.gdc_wait()`) before it reads or writes anything that kernel may touch.
        `native`: the extension module to launch through (default opgen._C; a user's extension for its
        spec's Triton ops)."""
        env.require()
        from triton.runtime.jit import JITFunction

        if not isinstance(fn, JITFunction):
            raise TypeError(f"opgen.jit needs a @triton.jit function, got {type(fn).__name__}")
        if not configs:
            raise ValueError("opgen.jit: a kernel needs at least one config")
        self.fn = fn
        self.name = name or fn.__name__
        self.grid = grid
        self.configs = tuple(configs)
        self.dependent_launch = dependent_launch
        self.names = [p.name for p in runtime_params(fn)]
        unknown = sorted(set(mutates or ()) - set(self.names))
        if unknown:
            raise ValueError(f"opgen.jit: {self.name}: mutates names unknown parameters {unknown} (have {self.names})")
        self.mutates = None if mutates is None else tuple(self.names.index(m) for m in mutates)
        # The module whose launcher type, variants and launches this kernel uses: opgen._C, or the user's
        # extension whose spec op this is (its own copy of the launcher: csrc/opgen/jit/jit_launcher.cpp).
        self.native = native if native is not None else env.native()
        self.launcher = self.native.JitLauncher(self.name, len(self.names), self._first_fit)
        self.launcher.kernel = self
        self.picks: dict[tuple[Any, ...], str] = {}  # argument sizes -> what was chosen and why (report)
        self._lock = threading.RLock()
        self._futures: dict[str, concurrent.futures.Future[KernelBinary]] = {}

    def __repr__(self) -> str:
        return f"<opgen.jit kernel {self.name}: {len(self.configs)} config(s), {self.launcher.variant_count} loaded>"

    def warmup(self, *args: Any) -> None:
        """Start compiling every config for the specialization of these example arguments."""
        device = _device(self, args)
        for config, spec in zip(self.configs, self._specialize(args), strict=True):
            self._future(spec, config, device)

    def _specialize(self, args: Sequence[Any]) -> list[Specialization]:
        backend = _backend(_device(self, args))
        return [specialize(self.fn, args, config.meta, backend) for config in self.configs]

    def _future(self, spec: Specialization, config: Config, device: int) -> concurrent.futures.Future[KernelBinary]:
        key = compiler.binary_key(self.fn, spec, config.options, device)
        with self._lock:
            future = self._futures.get(key)
            if future is None or (future.done() and future.exception() is not None):
                future = self._futures[key] = compiler.submit(self.fn, spec, config.options, device)
        return future

    def _first_fit(self, *args: Any) -> None:
        """The launcher's fallback: no loaded variant fits these arguments."""
        device = _device(self, args)
        key = autotune.size_key(args)
        with self._lock:
            if key in self.picks:  # another thread's first call with these sizes loaded it meanwhile
                self.native.jit_launch_strict(self.launcher, *args)
                return
            specs = self._specialize(args)
            futures = [self._future(s, c, device) for s, c in zip(specs, self.configs, strict=True)]
            forced = forcing.forced_config(self.name, len(self.configs))
            if forced is not None:
                index, why = forced, "forced by OPGEN_FORCE_CONFIG"
            elif len(self.configs) == 1:
                index, why = 0, "the only config"
            else:
                index, why = autotune.pick(self, args, specs, futures, device)
            self.add_variant(futures[index].result(), self.configs[index], args)
            self.picks[key] = f"config {index} ({self.configs[index].describe()}): {why}"
        self.native.jit_launch_strict(self.launcher, *args)

    def add_variant(self, binary: KernelBinary, config: Config, args: Sequence[Any], *, into: Any = None) -> None:
        """Load `binary` into the launcher (or `into`, a scratch launcher), ahead of the others. A binary
        that needs more shared memory than the arguments' device allows is refused (`check_fits`)."""
        check_fits(self.name, binary, config, _device(self, args))
        self.native.jit_add_variant(
            into if into is not None else self.launcher,
            binary.cubin,
            binary.name,
            binary.num_warps,
            binary.shared,
            [(p.kind, getattr(torch, p.dtype) if p.dtype else None, p.align16, p.div16) for p in binary.params],
            self._grid_for(config, args),
            binary.extra_pointers,
            dependent=self.dependent_launch,
        )

    def _grid_for(self, config: Config, args: Sequence[Any]) -> Any:
        """Grid programs for C++, or a Python function where the grid cannot be traced."""
        params = {name: i for i, name in enumerate(self.names)}
        grid = self.grid
        if callable(grid):
            traced = expr.trace_grid(grid, dict(zip(self.names, args, strict=True)), config.meta)
            if traced is None:
                return _python_grid(grid, self.names, config.meta)
            items: tuple[Any, ...] = traced
        else:
            items = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
            items = tuple(expr.parse(i) if isinstance(i, (str, int)) else i for i in items)
        if not 1 <= len(items) <= 3:
            raise JitError(f"{self.name}: a grid has 1 to 3 dimensions, got {len(items)}")
        try:
            return [list(expr.to_program(e, params, config.meta)) for e in items]
        except expr.ExprError as exc:
            raise JitError(f"{self.name}: bad grid: {exc}") from None


def check_fits(name: str, binary: KernelBinary, config: Config, device: int) -> None:
    """JitError where the binary needs more shared memory than the device allows a program (`env.fits`):
    its launch would fail, as Triton's launcher says with OutOfResources."""
    if not env.fits(binary.shared, device):
        raise JitError(
            f"{name}: config ({config.describe()}) needs {binary.shared} bytes of shared memory, and device "
            f"{device} allows {env.shared_memory_limit(device)} a program; fewer num_stages or smaller blocks fit"
        )


def _python_grid(grid: Callable[..., Any], names: Sequence[str], meta: Mapping[str, Any]) -> Callable[..., Any]:
    def evaluate(*args: Any) -> tuple[int, ...]:
        result = grid({**dict(zip(names, args, strict=True)), **meta})
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    return evaluate


def _device(kernel: JitKernel, args: Sequence[Any]) -> int:
    """The CUDA device of the tensor arguments; they must agree."""
    device: torch.device | None = None
    first = ""
    for name, arg in zip(kernel.names, args, strict=False):
        if isinstance(arg, torch.Tensor):
            if arg.device.type != "cuda":
                raise ValueError(f"opgen.jit: {kernel.name}: argument {name!r} is on {arg.device}, expected CUDA")
            if device is None:
                device, first = arg.device, name
            elif arg.device != device:
                raise ValueError(
                    f"opgen.jit: {kernel.name}: argument {name!r} is on {arg.device} but {first!r} on {device}"
                )
    return device.index if device is not None else torch.cuda.current_device()


def _backend(device: int) -> Any:
    from triton.compiler.compiler import make_backend

    return make_backend(env.target(device))
