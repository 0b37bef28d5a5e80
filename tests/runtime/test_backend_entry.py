"""The torch.compile backend is found by name through the `torch_dynamo_backends` entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from opgen.runtime.frontend.dynamo import compile_aten_graph, opgen_backend
from opgen.runtime.pipeline import CompileOptions


def test_entry_point_names_the_backend() -> None:
    points = {p.name: p for p in entry_points(group="torch_dynamo_backends")}
    assert points["opgen"].value == "opgen.runtime.frontend.dynamo:opgen_backend"
    assert points["opgen"].load() is opgen_backend
    assert "opgen" in torch._dynamo.list_backends()


def test_backend_graph_has_no_input_check() -> None:
    """Under torch.compile, Dynamo's guards check inputs: the generated code skips its own check."""
    x = torch.randn(4)
    gm = make_fx(lambda a: (a * 2).relu())(x)
    fn = compile_aten_graph(gm, CompileOptions(guard=False, cache=False), "f")
    assert "_check" not in fn.artifact.source and "mul_scalar(" in fn.artifact.source
    (out,) = fn(x)
    torch.testing.assert_close(out, (x * 2).relu())
    assert fn.report().direct == 2
