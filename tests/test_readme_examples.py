"""The README's and docs/ pages' Python examples run, and their links lead somewhere.

Every ```python block of a page runs, in order, in one namespace per page (a later block may use
what an earlier one defined, as a reader would), on the CPU. A block that cannot run here says so
on the line right before its fence, in an HTML comment the rendered page does not show:

    <!-- doc-test: cuda -->                    runs only where torch sees a CUDA GPU
    <!-- doc-test: skip (why, in words) -->    never runs: a fragment, a transcript, output

Any other `doc-test:` comment is an error, so a misspelt marker cannot silently skip a block.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- doc-test: (?P<what>cuda|skip \(.+\)) -->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@dataclass(frozen=True, slots=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    marker: str  # "", "cuda" or "skip (...)"


def blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, each with the marker on the line before its fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence["lang"] == "python":
            previous = lines[i - 1] if i else ""
            marker = MARKER.match(previous)
            if "doc-test:" in previous and marker is None:
                raise ValueError(f"{page.name}:{i}: unknown doc-test marker {previous!r} (see {__name__})")
            found.append(Block(page, i + 1, "\n".join(lines[i + 1 : end]), marker["what"] if marker else ""))
        i = end + 1
    return found


def _run(page: Path) -> int:
    """Run a page's blocks in order; returns how many ran."""
    namespace: dict[str, object] = {"__name__": f"doc_example_{page.stem}"}
    ran = 0
    for block in blocks(page):
        if block.marker.startswith("skip") or (block.marker == "cuda" and not torch.cuda.is_available()):
            continue
        where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}:{block.line}"
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(block.code, where, "exec"), namespace)  # the page's own example
            except Exception as exc:
                raise AssertionError(f"the example at {where} fails: {type(exc).__name__}: {exc}") from exc
        ran += 1
    return ran


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "opgen-cache"))
    monkeypatch.delenv("OPGEN_DEBUG", raising=False)


def test_the_readme_examples_run() -> None:
    assert _run(ROOT / "README.md") >= 2  # calling kernel_ops, compiling a model


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_the_docs_examples_run(page: Path) -> None:
    _run(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page: Path) -> None:
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)  # links inside code are code
    targets = [m["target"].partition("#")[0] for m in LINK.finditer(prose)]
    local = [t for t in targets if t and "://" not in t and not t.startswith("mailto:")]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n<!-- doc-test: cuda -->\n```python\ny = 2\n```\n"
        "<!-- doc-test: skip (a fragment) -->\n```python\nz\n```\n```bash\nnot python\n```\n"
    )
    assert [(b.line, b.code, b.marker) for b in blocks(page)] == [
        (1, "x = 1", ""),
        (5, "y = 2", "cuda"),
        (9, "z", "skip (a fragment)"),
    ]
    page.write_text("<!-- doc-test: skipp -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="unknown doc-test marker"):
        blocks(page)
    page.write_text("```python\nraise KeyError('boom')\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:1 fails: KeyError"):
        _run(page)
