"""The args-info registry: one plain dict per bound function, serialised as JSON into the module."""

from __future__ import annotations

import json
from typing import Any

from opgen.spec.defaults import parse_default
from opgen.spec.model import Arg, OpSpec, Return, TritonKernel, Variant


def arg_info(arg: Arg) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": arg.name,
        "type": str(arg.type),
        "kind": "input" if arg.type.base == "Tensor" else "attr",
        "kwarg_only": arg.kwarg_only,
        "optional": arg.type.optional or arg.default is not None,
    }
    if arg.default is not None:
        info["default"] = parse_default(arg.type, arg.default)
    if arg.alias is not None:
        info["alias"] = str(arg.alias)[1:-1]
        info["mutable"] = arg.alias.is_write
    if arg.alias is not None and arg.alias.is_write and arg.kwarg_only:
        info["out"] = True
    return info


def return_info(ret: Return, args: tuple[Arg, ...]) -> dict[str, Any]:
    info: dict[str, Any] = {"name": ret.name or "", "type": str(ret.type)}
    if ret.alias is not None:
        source = next(a for a in args if a.alias is not None and a.alias.alias_set == ret.alias.alias_set)
        info["alias"] = str(ret.alias)[1:-1]
        info["aliases_arg"] = source.name
    return info


def op_info(spec: OpSpec, variants: dict[str, dict[Variant, str]]) -> dict[str, Any]:
    schema = spec.schema
    returns = [return_info(r, schema.args) for r in schema.returns]
    siblings = variants.get(spec.group, {})
    info: dict[str, Any] = {
        "name": spec.python_name,
        "aten": spec.registry_name,
        "schema": str(schema),
        "args": [arg_info(a) for a in schema.args],
        "returns": returns,
        "returns_tuple": schema.returns_tuple or len(schema.returns) > 1,
        "backends": list(spec.backends),
        "kernels": {k.backend: k.qualified_name for k in spec.kernels},
        "variant": spec.variant.value,
        "functional": spec.group if Variant.FUNCTIONAL in siblings else None,
        "inplace": siblings.get(Variant.INPLACE),
        "out": siblings.get(Variant.OUT),
        "is_inplace": spec.variant is Variant.INPLACE,
        "is_out": spec.variant is Variant.OUT,
        "is_view": any(r.alias is not None and not r.alias.is_write for r in schema.returns),
        "mutates": [a.name for a in schema.args if a.alias is not None and a.alias.is_write],
        "release_gil": spec.release_gil,
        "checks": list(spec.checks),
        "opaque": list(spec.opaque),
        "doc": spec.doc,
        "location": str(spec.location),
    }
    if spec.triton is not None:
        info["triton"] = triton_info(spec.triton)
    if spec.torch_op is not None:  # only where given, so that other entries (and their BUILD_ID) stay as they were
        info["torch_op"] = spec.torch_op.path
    return info


def triton_info(kernel: TritonKernel) -> dict[str, Any]:
    """What the JIT loader (`opgen.jit.spec.launcher`) builds a Triton op's launcher from."""
    return {
        "kernel": kernel.kernel,
        "params": list(kernel.params),
        "args": {a.param: a.text for a in kernel.args},
        "outputs": {o.name: o.text for o in kernel.outputs},
        "grid": list(kernel.grid),
        "configs": [
            {"meta": dict(c.meta), "num_warps": c.num_warps, "num_stages": c.num_stages} for c in kernel.configs
        ],
        "candidate_for": kernel.candidate_for,
        "contiguous": list(kernel.contiguous),
        "same_shape": list(kernel.same_shape),
    }


def entry_json(spec: OpSpec) -> str:
    """The registry JSON of an op that has no variants (a Triton op), as `registry()` gives it."""
    return to_json(op_info(spec, {spec.group: {spec.variant: spec.python_name}}))


def registry(specs: tuple[OpSpec, ...]) -> list[dict[str, Any]]:
    variants: dict[str, dict[Variant, str]] = {}
    for spec in specs:
        variants.setdefault(spec.group, {})[spec.variant] = spec.python_name
    return [op_info(spec, variants) for spec in specs]


def to_json(info: dict[str, Any]) -> str:
    return json.dumps(info, sort_keys=True, separators=(",", ":"))
