"""`python -m opgen gen ...` for the build, with the opgen on PYTHONPATH (the one next to this file).

An editable install of opgen puts an import hook in front of PYTHONPATH. One whose source tree has
since moved or been deleted (another checkout, a removed worktree) would make the build import that
missing tree and fail with a FileNotFoundError. Here the path-based finder goes first, so the
generator that runs is the one the build names.
"""

import importlib.machinery
import runpy
import sys

sys.meta_path.insert(0, importlib.machinery.PathFinder)
runpy.run_module("opgen", run_name="__main__", alter_sys=True)
