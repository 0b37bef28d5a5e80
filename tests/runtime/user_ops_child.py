"""A model calling the example project's custom op (`torch.ops.mylib.scaled_add`), compiled strictly.

    python user_ops_child.py <build dir> <scenario> [<package path>]

Run in a child process by test_user_ops.py: importing the extension registers it (and its op) for the
rest of the process. Each scenario prints `OK <what>` lines; any mismatch raises.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

import opgen
from opgen.runtime.pipeline import default_pipeline, default_registry


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 16), requires_grad=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.linear(torch.relu(x), self.weight)
        return torch.ops.mylib.scaled_add(h, y, alpha=2.5) * 3


def inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 16, device=device), torch.randn(4, 8, device=device)


def check(name: str, fn: object, model: torch.nn.Module, device: str, calls: int = 3) -> None:
    for i in range(calls):
        x, y = inputs(device)
        x, y = x + i, y - i
        torch.testing.assert_close(fn(x, y), model(x, y), rtol=1e-5, atol=1e-5)  # type: ignore[operator]
    print(f"OK {name}")


def compiled(model: torch.nn.Module, device: str) -> None:
    """opgen.compile on the Python and the C++ backends (and CUDA graphs on a GPU), strict."""
    registry = default_registry()
    info = registry.lookup("mylib::scaled_add")
    assert info is not None and info.name == "my_ops__scaled_add" and info.module == "my_ops", info
    for backend in ("python", "cpp"):
        fast = opgen.compile(model, inputs(device), backend=backend, cache=False)
        assert type(fast).__name__ == {"python": "function", "cpp": "CppFunction"}[backend], type(fast)
        assert fast.report().fallbacks == (), fast.report()  # type: ignore[attr-defined]
        assert "my_ops__scaled_add" in fast.artifact.source  # type: ignore[attr-defined]
        check(f"compile {backend} {device}", fast, model, device)
    if device == "cuda":
        # The Triton candidate (my_ops_cuda.yaml) and the CUDA kernel: timed on the first call, the faster
        # kept, with the opt-in kernel_choice pass (before memory planning, as for kernel_ops' candidates).
        passes = default_pipeline()
        at = passes.index("memory")
        fast = opgen.compile(model, inputs(device), passes=(*passes[:at], "kernel_choice", *passes[at:]), cache=False)
        check("compile kernel_choice", fast, model, device)
        report = str(fast.report())  # type: ignore[attr-defined]
        assert "choice among my_ops__scaled_add, my_ops__scaled_add_triton" in report, report
        fast = opgen.compile(model, inputs(device), cuda_graphs=True, cache=False)
        check("compile cuda_graphs", fast, model, device, calls=4)
        line = fast.report().cuda_graph  # type: ignore[attr-defined]
        assert line.startswith("CUDA graph: captured"), line
        print("OK captured")


def backend(model: torch.nn.Module, device: str) -> None:
    """torch.compile(backend="opgen"), strict (fallback is off by default: an unbound op fails the compile)."""
    options: dict[str, object] = {"cuda_graphs": device == "cuda"}
    fast = torch.compile(model, backend="opgen", options=options, fullgraph=True)
    check(f"torch.compile {device}", fast, model, device, calls=4)


def package(model: torch.nn.Module, path: Path) -> None:
    opgen.package(model, inputs("cpu"), path, cache=False)
    loaded = opgen.load_package(path)
    assert loaded.package.extensions == ("my_ops",), loaded.package
    check("package", loaded, model, "cpu")


def load(model: torch.nn.Module, path: Path) -> None:
    """A fresh process: load_package imports the extension itself (its folder is on sys.path)."""
    assert "my_ops" not in sys.modules
    loaded = opgen.load_package(path)
    assert "my_ops" in sys.modules  # and so torch.ops.mylib.scaled_add exists for eager
    check("load", loaded, model, "cpu")


def main() -> None:
    build, scenario = Path(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, str(build))
    warnings.simplefilter("error", opgen.OpgenWarning)  # no silent fallback to Python or to plain mode
    device = "cuda" if scenario.endswith("_cuda") else "cpu"
    if scenario != "load":
        import my_ops  # noqa: F401 - registers the op with torch and the extension with opgen

    torch.manual_seed(0)  # the same weights in every process (a package is loaded in another one)
    model = Model().eval().to(device)
    with torch.no_grad():
        match scenario.removesuffix("_cuda"):
            case "compile":
                compiled(model, device)
            case "backend":
                backend(model, device)
            case "package":
                package(model, Path(sys.argv[3]))
            case "load":
                load(model, Path(sys.argv[3]))


if __name__ == "__main__":
    main()
