"""Run a fuzz or leak driver in a child process: a crash (a signal) or a hang is a result, not our death."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class ChildResult:
    returncode: int | None  # None: killed after the time limit (a hang)
    lines: list[str]
    stderr: str

    @property
    def crashed(self) -> bool:
        return self.returncode is not None and self.returncode < 0

    @property
    def last_call(self) -> str:
        calls = [line for line in self.lines if line.startswith("CALL ")]
        return calls[-1] if calls else "?"

    @property
    def failures(self) -> list[str]:
        return [line for line in self.lines if line.startswith("FAIL ")]

    @property
    def summary(self) -> str:
        done = [line for line in self.lines if line.startswith("DONE ")]
        return done[-1] if done else ""

    def counts(self) -> dict[str, float]:
        """`DONE a=1 b=2.5` as {'a': 1, 'b': 2.5}."""
        pairs = (item.split("=", 1) for item in self.summary.split()[1:] if "=" in item)
        return {k: float(v) for k, v in pairs}

    def verdict(self) -> str | None:
        """None if the child ran clean; otherwise what went wrong, for an assertion message."""
        if self.returncode is None:
            return f"hang (killed after the time limit) at: {self.last_call}"
        if self.crashed:
            side = " (in eager torch, after kernel_ops returned)" if self.lines[-1:] == ["EAGER"] else ""
            return f"crashed with signal {-self.returncode}{side} at: {self.last_call}"
        if self.returncode != 0 or self.failures or not self.summary:
            shown = "\n".join(self.failures[:20]) or self.stderr[-3000:]
            return f"exit status {self.returncode}, {len(self.failures)} failures:\n{shown}"
        return None


def run_child(script: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> ChildResult:
    command = [sys.executable, str(HERE / script), *args]
    child_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child_env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return ChildResult(None, out.splitlines(), "")
    return ChildResult(done.returncode, done.stdout.splitlines(), done.stderr)


def budget(name: str, default: int) -> int:
    """A fuzz budget from the environment (`OPGEN_FUZZ_...`), so CI and `make fuzz` share the tests."""
    return int(os.environ.get(name, default))
