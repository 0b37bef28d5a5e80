"""Bugs the call fuzzer found in the bindings, each as the call that found it (in a child process:
before the fix, the first one crashed the interpreter)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import torch
from opgen import kernel_ops as k
a = torch.ones(2)
calls = (
    lambda: k.add(a, a, **{"\udc80": 1}),          # keyword that UTF-8 cannot encode: was a segfault
    lambda: k.gelu(a, approximate="\udc80"),          # str argument likewise: was a bare UnicodeEncodeError
    lambda: k.layer_norm(a, [2], eps=2**70),          # an int that fits a float but not int64
    lambda: k.layer_norm(a, [2], eps=2**2000),        # an int no float holds
)
for call in calls:
    try:
        r = call()
        print("returned", type(r).__name__)
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def test_fuzzer_found_binding_bugs() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    assert done.stdout.splitlines() == [
        "TypeError kernel_ops.add(): got an unexpected keyword argument '\\udc80'",
        "ValueError kernel_ops.gelu(): argument 'approximate' is not valid UTF-8 text",
        "returned Tensor",
        "OverflowError kernel_ops.layer_norm(): argument 'eps' does not fit in a float",
    ]
