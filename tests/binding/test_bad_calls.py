"""Every bound function survives a matrix of bad arguments with a clear Python exception."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DRIVER = Path(__file__).with_name("bad_call_driver.py")


def test_every_function_survives_bad_arguments() -> None:
    result = subprocess.run([sys.executable, str(DRIVER)], capture_output=True, text=True, timeout=900)
    lines = result.stdout.splitlines()
    if result.returncode < 0:  # killed by a signal: the last line names the call that crashed
        raise AssertionError(f"crashed with signal {-result.returncode} at: {lines[-1] if lines else '?'}")
    failures = [line for line in lines if line.startswith("FAIL")]
    assert result.returncode == 0 and not failures, "\n".join(failures[:50]) or result.stderr[-3000:]
    summary = lines[-1]
    assert summary.startswith("DONE ") and int(summary.split()[1]) > 5000, summary


def test_binding_error_messages() -> None:
    """A few exact messages, as a user sees them."""
    script = """
import torch
from opgen import kernel_ops as k
a = torch.ones(2)
for call in (lambda: k.add(a), lambda: k.add(a, "x"), lambda: k.add(a, a, beta=1), lambda: k.add(a, a, 1),
             lambda: k.add(a, torch.ones(2, device="meta")), lambda: k.view(a, [1.5]),
             lambda: k.add(a, other=a, self=a), lambda: k.sum_dim(a, [2**70]), lambda: k.add(a, torch.ones(3)),
             lambda: k.get_kernel_op_info("ad")):
    try:
        call()
    except Exception as exc:
        print(type(exc).__name__, exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[:8] == [
        "TypeError kernel_ops.add(): missing required argument 'other' (pos 2)",
        "TypeError kernel_ops.add(): argument 'other' (position 2) must be Tensor, not str",
        "TypeError kernel_ops.add(): got an unexpected keyword argument 'beta'",
        "TypeError kernel_ops.add(): takes at most 2 positional arguments (3 given)",
        "RuntimeError kernel_ops.add(): expected all tensors on one device, "
        "but 'other' is on meta and 'self' is on cpu",
        "TypeError kernel_ops.view(): argument 'size' (position 2) must hold ints, but element 0 is float",
        "TypeError kernel_ops.add(): got multiple values for argument 'self'",
        "OverflowError kernel_ops.sum_dim(): argument 'dim' does not fit in int64",
    ]
    assert out.splitlines()[8].startswith("RuntimeError kernel_ops.add(): The size of tensor a (2) must match")
    assert out.splitlines()[9] == "KeyError \"kernel_ops has no function 'ad'; close matches: add, rand, add_\""
