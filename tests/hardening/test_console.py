"""What a user sees on the console: a normal compile and call print nothing; opgen's own warnings
are OpgenWarnings, given once, that say what to do.

Everything runs in a child process with every warning shown (`-W default`). Whatever `import torch`
alone prints there (where NumPy is missing, torch warns that it cannot initialize it) is torch's,
and is subtracted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

NORMAL = """
import torch, opgen

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) + x

model = Block().eval()
with torch.no_grad():
    fast = opgen.compile(model, (torch.randn(2, 8),))
    fast(torch.randn(2, 8))
    fast(torch.randn(3, 8))  # a new specialization
    compiled = torch.compile(model, backend="opgen")
    compiled(torch.randn(2, 8))
"""

FALLBACK = """
import warnings, torch, opgen
model = torch.nn.Linear(4, 4)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fast = opgen.compile(model, (torch.randn(2, 4),), fallback=True)
    for _ in range(3):
        fast(torch.randn(2, 4))
for w in caught:
    print(w.category.__name__, "|", w.message)
"""


def run(script: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPGEN_CACHE_DIR": str(cache)}
    env.pop("PYTHONWARNINGS", None)
    command = [sys.executable, "-W", "default", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True)


def test_normal_compile_and_call_print_nothing(tmp_path: Path) -> None:
    baseline = run("import torch", tmp_path).stderr
    for attempt in ("compiled", "from the cache"):
        done = run(NORMAL, tmp_path)
        assert done.stdout == "", attempt
        assert done.stderr.replace(baseline, "", 1) == "", f"{attempt}:\n{done.stderr}"


def test_fallback_warns_once_and_says_what_to_do(tmp_path: Path) -> None:
    lines = run(FALLBACK, tmp_path).stdout.splitlines()
    assert len(lines) == 1, lines
    category, message = lines[0].split(" | ")
    assert category == "OpgenWarning"
    assert message.startswith("opgen.compile: parameter 'weight' of Linear requires grad; running Linear eagerly")
    assert "torch.no_grad()" in message
