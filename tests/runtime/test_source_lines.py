"""Generated source stays in linecache while a function compiled from it lives, and no longer."""

from __future__ import annotations

import gc
import linecache

import torch
from torch import nn

import opgen
from opgen.runtime.execution import source_lines


class Owner:
    pass


def test_the_last_owner_of_a_file_name_removes_its_entry() -> None:
    first, second = Owner(), Owner()
    held = source_lines.hold("<opgen:test-lines>", "x = 1\n")
    source_lines.release_with(first, "<opgen:test-lines>", held)
    again = source_lines.hold("<opgen:test-lines>", "x = 1\n")
    source_lines.release_with(second, "<opgen:test-lines>", again)
    assert again is held and held.owners == 2
    del first
    gc.collect()
    assert linecache.getline("<opgen:test-lines>", 1) == "x = 1\n"  # `second` still runs this code
    del second
    gc.collect()
    assert "<opgen:test-lines>" not in linecache.cache


def test_other_source_under_the_same_name_replaces_the_entry_and_outlives_the_old_owner() -> None:
    old, new = Owner(), Owner()
    source_lines.release_with(old, "<opgen:test-swap>", source_lines.hold("<opgen:test-swap>", "a = 1\n"))
    source_lines.release_with(new, "<opgen:test-swap>", source_lines.hold("<opgen:test-swap>", "b = 2\n"))
    del old
    gc.collect()
    assert linecache.getline("<opgen:test-swap>", 1) == "b = 2\n"
    del new
    gc.collect()
    assert "<opgen:test-swap>" not in linecache.cache


def test_a_freed_compiled_graph_leaves_no_source_behind() -> None:
    """The generated Python function's source lives as long as the function (the Python backend's;
    the C++ backend's drops it once its program is bound)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    before = {name for name in linecache.cache if name.startswith("<opgen:")}
    with torch.no_grad():
        fast = opgen.compile(model, (x,), cache=False, backend="python")
        fast(x)
    ours = {name for name in linecache.cache if name.startswith("<opgen:")} - before
    assert len(ours) == 1
    assert "def " in "".join(linecache.getlines(next(iter(ours))))
    del fast
    gc.collect()
    assert not ours & set(linecache.cache)
