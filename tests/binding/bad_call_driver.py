"""Drive every kernel_ops function with bad arguments; print one line per call, exit 0 if all were clean.

Run as a subprocess by test_bad_calls.py, so that a crash (a signal) fails the test instead of
killing pytest. A clean call either succeeds or raises one of ALLOWED with a message naming the op.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch

from opgen import kernel_ops

ALLOWED = (TypeError, ValueError, RuntimeError, IndexError, NotImplementedError, OverflowError)
BIG = 2**70


def valid(arg: dict[str, Any]) -> Any:
    """A value of the right type (not necessarily one the kernel accepts)."""
    t = arg["type"]
    if t.endswith("?") and not t.startswith("Tensor?["):
        return None
    base = t.split("[")[0].rstrip("?")
    size = t.split("[")[1].split("]")[0] if "[" in t else None
    if size is not None:
        element = {"Tensor": torch.ones(2, 2), "Tensor?": None, "float": 1.0, "bool": True}.get(base, 1)
        return [element] * (int(size) if size else 1)
    return {
        "Tensor": torch.ones(2, 2),
        "int": 1,
        "SymInt": 1,
        "float": 1.0,
        "bool": False,
        "Scalar": 1,
        "str": "none",
        "ScalarType": torch.float32,
        "Layout": torch.strided,
        "Device": "cpu",
        "MemoryFormat": torch.contiguous_format,
    }[base]


def wrong(arg: dict[str, Any]) -> list[tuple[Any, type[BaseException], bool]]:
    """(value, expected exception, must the message name the argument)."""
    t = arg["type"]
    cases: list[tuple[Any, type[BaseException], bool]] = [(object(), TypeError, True)]
    if not t.endswith("?"):
        cases.append((None, TypeError, True))
    if "[" in t:
        cases += [("x", TypeError, True), ([object()], TypeError, True)]
        if t.startswith(("int", "SymInt")):
            cases.append(([BIG], OverflowError, True))
    elif t.startswith(("int", "SymInt")):
        cases += [(1.5, TypeError, True), (True, TypeError, True), (BIG, OverflowError, True)]
    elif t.startswith(("float", "bool", "str", "ScalarType", "Layout", "MemoryFormat")):
        cases.append(([], TypeError, True))
    elif t.startswith("Scalar"):
        # Any tensor, even a one-element one, as torch.ops.aten refuses it.
        cases += [("x", TypeError, True), (torch.ones(3), TypeError, True), (torch.ones(()), TypeError, True)]
    elif t.startswith("Device"):
        cases.append(("not-a-device", RuntimeError, False))
    return cases


def calls(info: dict[str, Any]) -> Iterator[tuple[str, tuple, dict, type[BaseException] | None, str | None]]:
    """(label, args, kwargs, expected exception or None for 'any clean outcome', name to mention)."""
    params = info["args"]
    positional = [a for a in params if not a["kwarg_only"]]
    base_args = [valid(a) for a in positional]
    base_kwargs = {a["name"]: valid(a) for a in params if a["kwarg_only"] and "default" not in a}
    required = [a for a in params if "default" not in a]
    if required:
        yield "no arguments", (), {}, TypeError, required[0]["name"]
    yield "too many positional", (*base_args, *[torch.ones(1)] * (len(params) + 1)), {}, TypeError, "positional"
    yield "unknown keyword", tuple(base_args), {**base_kwargs, "no_such_arg": 1}, TypeError, "no_such_arg"
    if positional:
        dup = {positional[0]["name"]: base_args[0]}
        yield "duplicate keyword", tuple(base_args), {**base_kwargs, **dup}, TypeError, positional[0]["name"]
    for i, arg in enumerate(params):
        for value, exc, named in wrong(arg):
            args, kwargs = list(base_args), dict(base_kwargs)
            if arg["kwarg_only"]:
                kwargs[arg["name"]] = value
            else:
                args[i] = value
            yield f"{arg['name']}={type(value).__name__}", tuple(args), kwargs, exc, arg["name"] if named else None
    yield from tensor_variations(info, base_args, base_kwargs)


def tensor_variations(info: dict[str, Any], base_args: list, base_kwargs: dict) -> Iterator[tuple]:
    """Same types, other devices, dtypes and layouts: any clean outcome is fine."""
    plain = [i for i, a in enumerate(info["args"]) if a["type"] == "Tensor" and not a["kwarg_only"]]
    variants = {
        "meta": lambda: torch.ones(2, 2, device="meta"),
        "int64": lambda: torch.ones(2, 2, dtype=torch.int64),
        "bool": lambda: torch.ones(2, 2, dtype=torch.bool),
        "empty": lambda: torch.ones(0, 3),
        "0-dim": lambda: torch.tensor(1.0),
        "non-contiguous": lambda: torch.ones(3, 4)[:, ::2],
        "sparse": lambda: torch.ones(2, 2).to_sparse(),
        "requires-grad": lambda: torch.ones(2, 2, requires_grad=True),
    }
    for label, make in variants.items():
        for i in plain:
            args = list(base_args)
            args[i] = make()
            expected = TypeError if label == "sparse" else None
            yield f"{info['args'][i]['name']}={label}", tuple(args), base_kwargs, expected, None
    if len(plain) >= 2:
        args = list(base_args)
        args[plain[1]] = torch.ones(2, 2, device="meta")
        yield "mixed devices", tuple(args), base_kwargs, None, None


def main() -> int:
    failures = 0
    count = 0
    for name, info in kernel_ops.get_kernel_ops_args_info().items():
        fn = getattr(kernel_ops, name)
        for label, args, kwargs, expected, mention in calls(info):
            count += 1
            print(f"{name}: {label}", flush=True)  # the last line before a crash names the culprit
            try:
                fn(*args, **kwargs)
                if expected is not None:
                    failures += 1
                    print(f"FAIL {name}: {label}: no error, expected {expected.__name__}")
            except ALLOWED as exc:
                message = str(exc)
                ok = message.startswith(f"kernel_ops.{name}(): ")
                ok &= expected is None or isinstance(exc, expected)
                ok &= mention is None or f"'{mention}'" in message or mention in message
                if not ok:
                    failures += 1
                    print(f"FAIL {name}: {label}: {type(exc).__name__}: {message}")
            except BaseException as exc:
                failures += 1
                print(f"FAIL {name}: {label}: unexpected {type(exc).__name__}: {exc}")
    print(f"DONE {count} calls, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
