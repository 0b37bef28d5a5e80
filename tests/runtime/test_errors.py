"""Errors are part of the interface: unsupported ops, fallback reports, bad inputs, grad, export failures."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import opgen
from opgen.runtime.errors import InputMismatchError, InputTypeError, RequiresGradError


class Kthvalue(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.kthvalue(x, 2).values + 1


class Adds(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def test_unsupported_op_names_the_op_the_node_and_what_to_do() -> None:
    with torch.no_grad(), pytest.raises(opgen.UnsupportedOpError) as info:
        opgen.compile(Kthvalue(), (torch.randn(5),))
    message = str(info.value)
    assert "graph node 'kthvalue'" in message and "op aten.kthvalue.default has no kernel_ops binding" in message
    assert "ops.yaml" in message and "fallback=True" in message
    assert info.value.op == "aten.kthvalue.default" and info.value.node == "kthvalue"


def test_fallback_runs_the_aten_op_and_reports_it() -> None:
    x = torch.randn(5)
    with torch.no_grad():
        compiled = opgen.compile(Kthvalue(), (x,), fallback=True)
        torch.testing.assert_close(compiled(x), torch.kthvalue(x, 2).values + 1)
    report = compiled.report()
    assert report.fallbacks == (("kthvalue", "aten.kthvalue.default"),) and report.direct == 1
    text = str(report)
    assert "direct through kernel_ops: 1" in text and "fallback to the ATen op:   1" in text
    assert "node 'kthvalue': aten.kthvalue.default" in text


def test_backend_unsupported_op_and_fallback_option() -> None:
    x = torch.randn(5)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match=r"op aten\.kthvalue\.default has no kernel_ops binding"):
        torch.compile(Kthvalue(), backend="opgen")(x)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(Kthvalue(), backend="opgen", options={"fallback": True})(x)
    torch.testing.assert_close(out, torch.kthvalue(x, 2).values + 1)


@pytest.fixture(params=["python", "cpp"])  # the same errors from the generated Python and the C++ executor
def adds(request: pytest.FixtureRequest) -> object:
    with torch.no_grad():
        return opgen.compile(Adds(), (torch.randn(4), torch.randn(4)), recompile=False, backend=request.param)


def test_wrong_number_of_inputs(adds) -> None:
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'y'"):
        adds(torch.randn(4))
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        adds(torch.randn(4), torch.randn(4), torch.randn(4))


def test_wrong_dtype_device_rank_and_type_name_the_input(adds) -> None:
    x = torch.randn(4)
    with pytest.raises(
        InputTypeError, match=r"input 'y' \(position 2\): expected dtype torch.float32, got torch.float64"
    ):
        adds(x, x.double())
    with pytest.raises(
        InputMismatchError, match=r"input 'x' \(position 1\): expected a tensor on cpu, got one on meta"
    ):
        adds(torch.empty(4, device="meta"), x)
    with pytest.raises(
        InputMismatchError, match=r"input 'y' \(position 2\): expected a 1-d tensor of shape \(4,\), got 2-d \(2, 2\)"
    ):
        adds(x, torch.randn(2, 2))
    with pytest.raises(InputTypeError, match=r"input 'x' \(position 1\) must be a torch.Tensor, got float"):
        adds(1.0, x)
    assert issubclass(InputTypeError, TypeError) and issubclass(InputMismatchError, ValueError)


def test_new_shapes_error_when_recompiling_is_off(adds) -> None:
    with pytest.raises(
        InputMismatchError,
        match=r"input 'x' \(position 1\): compiled for shape \(4,\).*got shape \(6,\).*recompiling is off",
    ):
        adds(torch.randn(6), torch.randn(6))


def test_new_shapes_recompile_by_default() -> None:
    with torch.no_grad():
        compiled = opgen.compile(Adds(), (torch.randn(4), torch.randn(4)))
        for n in (6, 4, 6):
            x, y = torch.randn(n), torch.randn(n)
            torch.testing.assert_close(compiled(x, y), x + y)
        x = torch.randn(8)[::2]  # other strides: another specialization, same answer
        torch.testing.assert_close(compiled(x, x), x + x)
    assert compiled.report().specializations == 3


def test_the_same_tensor_for_two_inputs() -> None:
    x = torch.randn(4)
    with torch.no_grad():
        compiled = opgen.compile(Adds(), (x, torch.randn(4)))
        for _ in range(3):
            torch.testing.assert_close(compiled(x, x), x + x)
    assert compiled.report().specializations == 1


def test_inference_mode_and_plain_calls_share_one_specialization() -> None:
    x, y = torch.randn(4), torch.randn(4)
    with torch.no_grad():
        compiled = opgen.compile(Adds(), (x, y))
    for _ in range(2):
        with torch.inference_mode():
            torch.testing.assert_close(compiled(x, y), x + y)
            xi = torch.randn(4)
            torch.testing.assert_close(compiled(xi, y), xi + y)
        torch.testing.assert_close(compiled(x, y), x + y)
    assert compiled.report().specializations == 1


def test_requires_grad_is_a_clear_error() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(RequiresGradError, match=r"parameter 'weight' of Linear requires grad.*torch.no_grad\(\)"):
        opgen.compile(model, (torch.randn(1, 3),))
    with torch.no_grad():
        compiled = opgen.compile(model, (torch.randn(1, 3),))
    with pytest.raises(RequiresGradError, match="inference only"):
        compiled(torch.randn(1, 3))  # grad mode is on again: the result would lack its grad history
    with pytest.raises(RequiresGradError, match="example input 1"):
        opgen.compile(Adds(), (torch.randn(2, requires_grad=True), torch.randn(2)))


def test_requires_grad_with_fallback_runs_eagerly_and_says_so() -> None:
    model = nn.Linear(3, 2)
    x = torch.randn(1, 3)
    with pytest.warns(UserWarning, match="running Linear eagerly"):
        compiled = opgen.compile(model, (x,), fallback=True)
    out = compiled(x)
    assert out.requires_grad and compiled.report().runs_eagerly
    assert "runs eagerly" in str(compiled.report())


def test_backend_requires_grad() -> None:
    torch._dynamo.reset()
    with pytest.raises(Exception, match="opgen runs inference only"):
        torch.compile(nn.Linear(3, 2), backend="opgen")(torch.randn(1, 3))
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="running this graph eagerly"):
        out = torch.compile(nn.Linear(3, 2), backend="opgen", options={"fallback": True})(torch.randn(1, 3))
    assert out.requires_grad


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_export_failure_passes_on_exports_error_with_what_opgen_was_doing() -> None:
    with torch.no_grad(), pytest.raises(Exception) as info:
        opgen.compile(DataDependent(), (torch.randn(3),))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "opgen.compile: this happened while capturing DataDependent with torch.export.export" in notes
    assert "float32[3]" in notes
    assert type(info.value).__module__.startswith("torch")  # torch.export's own exception, passed on


def test_example_inputs_must_be_tensors() -> None:
    with torch.no_grad(), pytest.raises(TypeError, match="example input 2 is int"):
        opgen.compile(Adds(), (torch.randn(2), 3))


def test_opgen_debug_prints_the_generated_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPGEN_DEBUG", "1")
    with torch.no_grad():
        opgen.compile(Adds(), (torch.randn(3), torch.randn(3)))
    err = capsys.readouterr().err
    assert "def forward(x, y):" in err and "add(x, y)  # add: aten.add.Tensor" in err


def test_unknown_pass_and_backend_option() -> None:
    with torch.no_grad(), pytest.raises(ValueError, match="unknown opgen pass"):
        opgen.compile(Adds(), (torch.randn(3), torch.randn(3)), passes=["memory", "nope"], cache=False)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="unknown options"):
        torch.compile(Adds(), backend="opgen", options={"nope": 1})(torch.randn(3), torch.randn(3))


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def test_warnings_name_the_users_line_not_opgens() -> None:
    """However deep opgen's call chain (and Dynamo's), a warning points at the line that compiled or called."""
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opgen.compile(_Linear(), (x,), fallback=True, cache=False)  # grad mode on: runs eagerly, warning
        with torch.no_grad():
            opgen.compile(_Linear(), (x,), cuda_graphs=True, cache=False)  # no CUDA tensors: runs plain
            torch.compile(_Linear(), backend="opgen", options={"cuda_graphs": True})(x)
    opgen_warnings = [w for w in caught if issubclass(w.category, opgen.OpgenWarning)]
    assert len(opgen_warnings) == 3, [str(w.message) for w in caught]
    assert {w.filename for w in opgen_warnings} == {__file__}, [(w.filename, w.lineno) for w in opgen_warnings]


def test_only_custom_ops_get_the_advice_to_bind_them_in_an_extension() -> None:
    """The lowering says which ops are torch.library custom ops; torch's own namespaces (a collective,
    `_c10d_functional`) keep the ops.yaml advice."""
    torch_own = str(opgen.UnsupportedOpError("_c10d_functional.broadcast.default", "b", "not lowered yet"))
    assert "has no kernel_ops binding (not lowered yet). Add it to ops.yaml" in torch_own
    assert "opgen.draft" not in torch_own
    custom = str(opgen.UnsupportedOpError("mylib.scaled_add.default", "s", custom=True))
    assert "python -m opgen.draft mylib" in custom and "torch_op: mylib::scaled_add" in custom


class _RaisingIndexSelect(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten.index_select.default:
            raise LookupError("raised by a Python mode under the kernel")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["cpp", "python"])
def test_a_python_exception_under_a_kernel_comes_back_whole(backend: str) -> None:
    # embedding's kernel calls index_select through the dispatcher; a Python mode there raises, and torch
    # carries that exception through C++ with an empty what(): the caller gets the Python one, not "no message".
    model = nn.Embedding(10, 4).requires_grad_(False)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        compiled = opgen.compile(model, (ids,), backend=backend)
    with _RaisingIndexSelect(), pytest.raises(LookupError, match="raised by a Python mode under the kernel"):
        compiled(ids)
