"""Python type annotations for the `kernel_ops.pyi` stub."""

from __future__ import annotations

import textwrap

from opgen.gen.bindings import python_default
from opgen.spec.model import Arg, OpSpec, Type

_SCALAR_PY = {
    "int": "int",
    "SymInt": "int",
    "float": "float",
    "bool": "bool",
    "Scalar": "complex | float | bool | Tensor",
    "str": "str",
    "ScalarType": "torch.dtype",
    "Layout": "torch.layout",
    "Device": "torch.device | str",
    "MemoryFormat": "torch.memory_format",
    "Tensor": "Tensor",
}


def py_type(type_: Type) -> str:
    text = _SCALAR_PY[type_.base]
    if type_.elem_optional:
        text = f"{text} | None"
    if type_.is_list:
        text = f"Sequence[{text}]" + (f" | {text}" if type_.size else "")
    return f"{text} | None" if type_.optional else text


def py_return(spec: OpSpec) -> str:
    types = ["list[Tensor]" if r.type.is_list else _SCALAR_PY[r.type.base] for r in spec.schema.returns]
    if spec.schema.returns_tuple or len(types) > 1:
        return f"tuple[{', '.join(types)}]"
    return types[0]


def py_param(arg: Arg) -> str:
    text = f"{arg.name}: {py_type(arg.type)}"
    return text if arg.default is None else f"{text} = {python_default(arg)}"


def stub_function(spec: OpSpec) -> str:
    params, star = [], False
    for arg in spec.schema.args:
        if arg.kwarg_only and not star:
            params.append("*")
            star = True
        params.append(py_param(arg))
    doc = f"{spec.schema}\n\n{spec.doc}".rstrip().replace('"""', "'''").replace("\\", "\\\\")
    doc = textwrap.indent(doc, "    ").lstrip()
    return f'def {spec.python_name}({", ".join(params)}) -> {py_return(spec)}:\n    """{doc}\n    """\n'
