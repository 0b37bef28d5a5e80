"""One C++ runtime in the process: the extension uses the shared libstdc++ that torch's libraries load.

A toolchain that links libstdc++ statically by default (the GPU machine's g++) put a second copy of it in
the extension, beside the shared one torch loads, and the first C++ error whose message formatted a number
crashed the process (a segmentation fault in `jit_launch_strict`). `opgen.cmake` links torch's libstdc++
by path (`_opgen_one_cxx_runtime`); here the built extension is read back: it needs the shared library, and
defines none of the runtime's own code (its locales, its streams), only the templates every C++ object
instantiates.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import opgen._C
import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("readelf") is None or shutil.which("nm") is None,
    reason="reads the extension's ELF tables with binutils (Linux)",
)
# The mangled prefixes of libstdc++'s own code: std::locale, the codecvt facets, std::ios_base, num_put<char>.
RUNTIME_CODE = ("_ZNSt6locale", "_ZNKSt7codecvt", "_ZNKSt19__codecvt", "_ZNSt8ios_base", "_ZNKSt7num_putIc")


def test_the_extension_needs_the_shared_libstdcxx_and_carries_none_of_it() -> None:
    path = opgen._C.__file__
    needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in needed, needed
    defined = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    carried = [line.split()[-1] for line in defined.splitlines() if line.split()[-1].startswith(RUNTIME_CODE)]
    assert carried == [], carried[:10]
