"""Binding a compiled graph's fused kernels (`Program.fused`, from the fusion pass).

Each `FusedKernel` carries its Triton module's source. At load time the source is written to the
JIT cache (`OPGEN_CACHE_DIR/jit/fused/<name>_<hash>.py`: Triton reads a kernel's source from its
file) and imported; its launcher starts compiling in the background. The generated code then hands
its function of the ATen calls the kernel replaces to the `FusedBinding`, which returns what the
body calls: a multi-kernel `Choice` between the Triton kernel (behind a small function that
allocates its outputs) and those ATen calls, timed on the first call with real inputs and kept
(`opgen.jit.choice`). A kernel that fails to compile or launch leaves the ATen calls running, with
a warning.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from opgen.disk import write_atomic
from opgen.jit.cache import jit_dir
from opgen.jit.choice import Choice
from opgen.jit.errors import JitError
from opgen.jit.graph import fixed_grid_launcher
from opgen.runtime.errors import warn
from opgen.runtime.ir import FusedKernel


class FusedBinding:
    """What `rt.jit[local]` holds for a fused kernel: called once by the generated code with the ATen
    function, it returns the callable the body calls; `.choice` then reaches the choice (report)."""

    def __init__(self, spec: FusedKernel) -> None:
        self.spec = spec
        self.choice: Choice | None = None
        self.error: str | None = None
        try:
            self.launcher: Any = _launcher(spec)
        except (JitError, ImportError, SyntaxError, OSError) as exc:
            self.launcher, self.error = None, str(exc)

    def __call__(self, aten: Callable[..., Any]) -> Callable[..., Any]:
        if self.launcher is None:
            warn(
                f"opgen: fused kernel {self.spec.name} ({', '.join(self.spec.nodes)}) cannot be loaded ({self.error}); "
                "its ATen kernels run instead"
            )
            return aten
        self.choice = Choice(
            f"{self.spec.local} ({self.spec.describe})",
            {"triton": _allocating(self.launcher, self.spec), "aten": aten},
            identity=(_digest(self.spec),),
            writes=self.spec.written_inputs,
            fixed_sizes=True,
            reliable="aten",
            names=(self.spec.name, self.spec.local),
        )
        return self.choice.call  # type: ignore[no-any-return]

    def describe(self) -> str:
        """`<the kernel's heading>: triton (fastest on the first call: ...)` (`FusedKernel.heading`)."""
        if self.choice is None:
            told = f"ATen kernels ({self.error})" if self.error else "not bound"
        elif not self.choice.picks:
            told = "not called yet"
        else:
            told = "; ".join(f"{pick} ({why})" for pick, why in self.choice.picks.values())
        return f"{self.spec.heading}: {told}"


def bindings(specs: Sequence[FusedKernel]) -> dict[str, FusedBinding]:
    return {spec.local: FusedBinding(spec) for spec in specs}


def load_function(spec: FusedKernel, prefix: str = "opgen_fused") -> Any:
    """The @triton.jit function of the spec's source, imported from its file in the JIT cache (once per
    process and `prefix`: Triton's interpreter, for one, wants its own import of the same source)."""
    digest = _digest(spec)
    module_name = f"{prefix}_{spec.name}_{digest}"
    if module_name in sys.modules:
        return getattr(sys.modules[module_name], spec.name)
    path = _write(f"{spec.name}_{digest}.py", spec.source)
    found = importlib.util.spec_from_file_location(module_name, path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    sys.modules[module_name] = module
    return getattr(module, spec.name)


def _digest(spec: FusedKernel) -> str:
    return hashlib.sha256(spec.source.encode()).hexdigest()[:16]


def _write(filename: str, source: str) -> Path:
    for folder in (jit_dir() / "fused", Path(tempfile.gettempdir()) / "opgen-fused"):
        path = folder / filename
        try:
            if not path.is_file() or path.read_text(encoding="utf-8") != source:
                folder.mkdir(parents=True, exist_ok=True)
                write_atomic(path, source)
            return path
        except OSError:
            continue
    raise OSError(f"no writable folder for the fused kernel source {filename}")


def _launcher(spec: FusedKernel) -> Any:
    fn = load_function(spec)
    # The kernel's own parameter names (inputs, then outputs): a kernel shared by several calls (a
    # model's layers) names them apart from any one call's values.
    params = list(fn.arg_names[: len(spec.inputs) + len(spec.outputs)])
    mutates = [params[i] for i in spec.written_inputs] + params[len(spec.inputs) :]
    return fixed_grid_launcher(
        fn, spec.configs, params, mutates, spec.name, lambda: _examples(spec), dependent_launch=spec.dependent_launch
    )


def _examples(spec: FusedKernel) -> list[torch.Tensor]:
    """Aligned stand-ins for the arguments: their dtypes and device are all the specialization needs."""
    device = spec.device
    dtypes = (*spec.input_dtypes, *(v.meta.dtype for v in spec.outputs))  # type: ignore[union-attr]
    return [torch.empty(16, dtype=getattr(torch, d), device=device) for d in dtypes]


def _allocating(launch: Any, spec: FusedKernel) -> Callable[..., Any]:
    """`fused(inputs...) -> outputs`: allocates the outputs with their graph strides, then launches
    (returns None where the kernel only writes its inputs)."""
    args = ", ".join(spec.inputs)
    outs = [v.name for v in spec.outputs]
    lines = [f"def {spec.local}_triton({args}):"]
    scope: dict[str, Any] = {"launch": launch, "empty_strided": torch.empty_strided}
    for i, value in enumerate(spec.outputs):
        meta = value.meta
        assert meta is not None
        scope[f"dtype{i}"], scope[f"device{i}"] = getattr(torch, meta.dtype), torch.device(meta.device)
        lines.append(f"    {value.name} = empty_strided({meta.shape}, {meta.stride}, dtype=dtype{i}, device=device{i})")
    lines.append(f"    launch({', '.join((*spec.inputs, *outs))})")
    if outs:
        lines.append(f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}")
    exec(compile("\n".join(lines), f"<opgen fused {spec.name}>", "exec"), scope)  # noqa: S102 - our own text
    return scope[f"{spec.local}_triton"]  # type: ignore[no-any-return]
