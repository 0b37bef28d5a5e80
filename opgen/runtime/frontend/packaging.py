"""`opgen.package(model, example_inputs, path)` and `opgen.load_package(path)`: a compiled graph as one file
that opgen's prebuilt C++ executor runs, from Python or from a C++ program with no Python in it.

`package` exports and compiles the model as `opgen.compile(..., backend="cpp")` does (CPU, static
shapes) and writes the executor program, the constant tensors, the input and output structure and
the versions it was made with (`artifact.package_file`). A graph the executor cannot run (what the
C++ backend falls back on) is a `PackageError` naming what.

`load_package` reads the file with the same C++ reader a C++ program uses (csrc/opgen/package/package.h,
through `_C.read_package`), which checks it (format, torch version, the op spec's thunks,
checksums), and binds the program to the executor as `backend="cpp"` does: a `CppFunction` that
checks its inputs on every call. Inputs of another count, dtype, device or shape are errors naming
the input; a package runs the shapes it was made for (no recompiling: nothing to recompile from).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import torch
from torch.utils import _pytree as pytree

from opgen import _C, extensions
from opgen.runtime.artifact import package_file, setup_folding
from opgen.runtime.artifact.compiled import CompiledGraph, InputSpec
from opgen.runtime.backends import cpp
from opgen.runtime.capture.export import as_module, constants_of, export_program, model_name, signature_of
from opgen.runtime.errors import InputMismatchError, PackageError
from opgen.runtime.execution.guards import PROCEED, diagnose, shape_mismatch_message
from opgen.runtime.frontend.inputs import example_tensors, unflattener
from opgen.runtime.pipeline import CompileOptions, compile_graph, default_pipeline, default_registry
from opgen.runtime.torch_symbols import dtype_name


def package(
    model: Any,
    example_inputs: Iterable[torch.Tensor],
    path: str | Path,
    *,
    dynamic_shapes: Any = None,
    fallback: bool = False,
    passes: Sequence[str] | None = None,
    cache: bool = True,
) -> Path:
    """Compile `model` for inputs like `example_inputs` (CPU, these shapes) and write it to `path` as one file.

    fallback: ops kernel_ops lacks call the ATen op through the dispatcher (the package still needs no Python).
    passes, cache: as for `opgen.compile`. dynamic_shapes: not supported yet (a PackageError says so).
    Returns the path written.
    """
    if dynamic_shapes is not None:
        raise PackageError(
            "opgen.package: dynamic_shapes is not supported: a package holds static shapes (the C++ executor "
            "runs dynamic shapes in this process: opgen.compile(..., backend='cpp')). Package one file per "
            "input shape."
        )
    inputs = _example_inputs(example_inputs)
    module = as_module(model)
    with torch.no_grad():
        graph, constants, spec = _compile(module, inputs, fallback, passes, cache)
    form = _form(graph)
    folded = _fold_setup(graph, constants)
    header = package_file.PackageHeader(
        name=model_name(module),
        torch_version=torch.__version__,
        thunk_digest=str(_C.THUNK_DIGEST),
        kernel_ops_build_id=default_registry().build_id,
        output_form=form,
        output_tree=_tree(spec, model_name(module)) if form == "pytree" else "",
        program=folded.program,
        extensions=_extensions_called(graph),
    )
    records = [_constant_bytes(key, value) for key, value in folded.constants]
    path = Path(path)
    package_file.write(path, header, records, _C.crc32c)
    return path


def _extensions_called(graph: CompiledGraph) -> tuple[tuple[str, str], ...]:
    """(module, thunk digest) of each extension whose kernels the graph calls (`opgen.extensions`)."""
    by_name = default_registry().by_name
    names = sorted({info.module for k in graph.kernels if (info := by_name.get(k)) is not None and info.module})
    return tuple((name, str(_extension(name).THUNK_DIGEST)) for name in names)


def _extension(name: str) -> Any:
    module = extensions.find(name)
    assert module is not None, name  # the registry named it: it was imported
    return module


def _import_extensions(path: Path) -> tuple[str, ...]:
    """Import the extension modules a package's program calls (each registers its thunks with the
    executor), checking each is the build the package was made with; PackageError naming what is missing."""
    needed = package_file.read_extensions(path)
    for name, digest in needed:
        try:
            module = extensions.find(name) or importlib.import_module(name)
        except ImportError as exc:
            raise PackageError(
                f"opgen package {path}: its program calls the kernels of the extension module '{name}', which "
                f"cannot be imported here ({exc}); put the folder it was built in on sys.path (or install it) "
                "and load the package again"
            ) from exc
        if extensions.find(name) is None:
            raise PackageError(f"opgen package {path}: module '{name}' is not an opgen extension")
        if str(module.THUNK_DIGEST) != digest:
            raise PackageError(
                f"opgen package {path}: made with another build of extension '{name}' (thunks {digest}); "
                f"the imported one's are {module.THUNK_DIGEST}: package the model again with this build"
            )
    if needed:
        default_registry()  # registers the extensions' thunks with opgen's executor
    return tuple(name for name, _ in needed)


def _example_inputs(example_inputs: Iterable[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    inputs = example_tensors(example_inputs, "opgen.package", "a package takes tensors")
    for i, value in enumerate(inputs, start=1):
        if value.device.type != "cpu":
            raise PackageError(f"opgen.package: example input {i} is on {value.device}; packages run on CPU only")
    return inputs


def _compile(
    module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], fallback: bool, passes: Sequence[str] | None, cache: bool
) -> tuple[CompiledGraph, dict[str, torch.Tensor], Any]:
    """The graph compiled for the C++ executor, its constants and the output's pytree spec."""
    ep = export_program(module, inputs, default_registry())
    sig = signature_of(ep)
    constants = constants_of(module, ep)
    options = CompileOptions(
        fallback, tuple(passes) if passes is not None else default_pipeline(), cache, backend="cpp"
    )
    graph, _ = compile_graph(ep.graph_module, sig, options, model_name(module), str(ep.call_spec.out_spec))
    printed = graph.printed_by(cpp.NAME)
    if printed.error:
        raise PackageError(
            f"opgen.package: {model_name(module)} cannot run on the C++ executor: {printed.error} "
            "(opgen.compile(model, inputs) runs it on the Python backend)"
        )
    if externs := _externs(printed.text):
        raise PackageError(
            f"opgen.package: {model_name(module)} calls functions bound in the running process "
            f"({', '.join(externs)}: Python functions, Triton kernels or collectives), and a package runs "
            "without Python (opgen.compile(model, inputs, backend='cpp') runs it in this process)"
        )
    for _, key in graph.constants:
        if constants[key].device.type != "cpu":
            raise PackageError(f"opgen.package: constant '{key}' is on {constants[key].device}; packages run on CPU")
    return graph, constants, ep.call_spec.out_spec


def _externs(program: str) -> list[str]:
    """The functions a program calls that the process binds (its `extern` lines): none in a package
    (the reader refuses a file whose program names any: csrc/opgen/package/package.cpp)."""
    return [line.split()[1] for line in program.splitlines() if line.startswith("extern ")]


# The dtypes the package reader knows (csrc/opgen/exec/executor_parse.cpp: dtypes_by_name).
READABLE_DTYPES = frozenset(
    ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64",
     "complex128")
)  # fmt: skip


def _fold_setup(graph: CompiledGraph, constants: dict[str, torch.Tensor]) -> setup_folding.Folded:
    """The program with its constant-only setup calls run now (`artifact.setup_folding`)."""
    program = graph.printed_by(cpp.NAME).text
    values = _C.setup_values(program, [constants[key] for _, key in graph.constants])
    return setup_folding.fold(program, values, _storable, _shares_storage)


def _storable(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.is_quantized
        and dtype_name(value.dtype) in READABLE_DTYPES
    )


def _shares_storage(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    ptr = a.untyped_storage().data_ptr()
    return ptr != 0 and ptr == b.untyped_storage().data_ptr()


def _form(graph: CompiledGraph) -> str:
    """The return line's form; PackageError where it returns something other than tensors."""
    line = next(t for t in graph.printed_by(cpp.NAME).text.splitlines() if t.strip().startswith("return "))
    _, form, *values = line.split()
    literals = [v for v in values if not (v[0] in "rs" and v[1:].isdigit())]
    if literals:
        raise PackageError(
            f"opgen.package: graph {graph.name} returns {', '.join(literals)}, not a tensor; a package returns "
            "tensors only (return the value from the model as a tensor, or leave it out)"
        )
    return form


def _tree(spec: Any, name: str) -> str:
    try:
        return str(pytree.treespec_dumps(spec))
    except Exception as exc:
        raise PackageError(
            f"opgen.package: the output structure of {name} cannot be stored ({exc}); return a tensor, or a "
            "tuple, list or dict of them"
        ) from exc


def _constant_bytes(key: str, tensor: torch.Tensor) -> package_file.ConstantBytes:
    """The storage span `tensor`'s sizes and strides cover, from its first element."""
    t = tensor.detach()
    if t.layout != torch.strided:
        raise PackageError(f"opgen.package: constant '{key}' is a {t.layout} tensor; packages hold dense ones")
    span = 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
    data = ctypes.string_at(flat.data_ptr(), span * t.element_size()) if span else b""
    return package_file.ConstantBytes(key, dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()), data)


def load_package(path: str | Path) -> Callable[..., Any]:
    """The packaged graph as a callable taking the model's tensors and returning its outputs (C++ executor).

    PackageError for a file that is not a package, is truncated or corrupt, or was made with another
    package format, torch version or op spec; input errors as `opgen.compile`'s (InputTypeError,
    InputMismatchError), naming the input.
    """
    start = time.perf_counter()
    needed = _import_extensions(Path(path))
    contents = _C.read_package(str(path))
    specs = program_inputs(contents["program"])
    tree = contents["output_tree"]
    unflatten = unflattener(pytree.treespec_loads(tree)) if contents["output_form"] == "pytree" else None
    handler = _slow_path(specs, str(path))
    try:
        fn = cpp.bind_program(contents["program"], contents["constants"], {}, handler, unflatten)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise PackageError(f"opgen package {path}: its program does not run here: {exc}") from exc
    fn.package = PackageInfo(  # type: ignore[attr-defined]
        Path(path), contents["name"], specs, contents["torch_version"], contents["thunk_digest"],
        contents["kernel_ops_build_id"], needed, time.perf_counter() - start,
    )  # fmt: skip
    return fn


@dataclasses.dataclass(frozen=True, slots=True)
class PackageInfo:
    """What `load_package(path).package` says about the file."""

    path: Path
    name: str
    inputs: tuple[InputSpec, ...]
    torch_version: str
    thunk_digest: str
    kernel_ops_build_id: str
    extensions: tuple[str, ...]  # the extension modules whose kernels it calls (imported by load_package)
    load_seconds: float


def program_inputs(program: str) -> tuple[InputSpec, ...]:
    """The `input` lines of an executor program (`input r0 x float32 cpu [16] [1]`) as input specs."""
    specs = []
    for line in program.splitlines():
        words = line.split()
        if words[:1] == ["input"] and len(words) == 7:
            shape, stride = (tuple(int(n) for n in w.strip("[]").split(",") if n) for w in words[5:7])
            specs.append(InputSpec(unquote(words[2]), shape, stride, words[3], words[4]))
    return tuple(specs)


def _slow_path(specs: tuple[InputSpec, ...], where: str) -> Callable[..., Any]:
    """The input check's slow path: a clear error for inputs the program cannot take, else run it."""

    def on_mismatch(*args: Any) -> Any:
        if diagnose(specs, args):
            raise InputMismatchError(
                f"opgen package {where}: {shape_mismatch_message(specs, args)} (a package runs the shapes it "
                "was made for: package the model again for these, or pass .contiguous() inputs)"
            )
        return PROCEED

    return on_mismatch
