"""One Triton compile, in this process or in a compile worker (`opgen.jit.workers` starts this file).

Imports nothing of opgen or torch, so that a worker starts in the time it takes to import triton:
requests and results are plain Python values. Run as a script, it serves requests from its stdin
until that closes: each a pickled (module path, function name, signature, constexprs, attrs,
num_warps, num_stages, target), each answered on its stdout with a pickled ("ok", fields) or
("error", message).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
from typing import Any

_MODULES: dict[str, Any] = {}
SCRATCH = ("global_scratch_size", "profile_scratch_size")  # Triton's scratch memories, by metadata field


def compile_fields(fn: Any, signature: dict, constexprs: dict, attrs: dict, num_warps: int, num_stages: int,
                   target: Any) -> dict[str, Any]:  # fmt: skip
    """The binary of one specialization of `fn`, as the fields of opgen's `KernelBinary` that Triton
    decides (its name, cubin, warps, stages, shared memory), and what opgen's launcher must refuse."""
    import triton
    from triton.compiler import ASTSource

    source = ASTSource(fn, signature, constexprs, attrs)
    compiled = triton.compile(source, target=target, options={"num_warps": num_warps, "num_stages": num_stages})
    md = compiled.metadata
    return {
        "name": md.name,
        "cubin": compiled.asm["cubin"],
        "num_warps": md.num_warps,
        "num_stages": md.num_stages,
        "shared": md.shared,
        "num_ctas": getattr(md, "num_ctas", 1),
        "scratch": {s: getattr(md, s, 0) for s in SCRATCH},
        "extra_pointers": sum(hasattr(md, s) for s in SCRATCH),
        "arch": str(md.arch),
    }


def load_kernel(path: str, name: str) -> Any:
    """The @triton.jit function `name` of the module file at `path` (imported once per process)."""
    module = _MODULES.get(path)
    if module is None:
        spec = importlib.util.spec_from_file_location(f"opgen_worker_{len(_MODULES)}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[path] = module
    return getattr(module, name)


def serve() -> None:
    import triton.compiler  # noqa: F401 - at start, not at the first request: the parent may start workers early

    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what triton prints goes to stderr, not the replies
    requests = sys.stdin.buffer
    while True:
        try:
            path, name, *rest = pickle.load(requests)  # noqa: S301 (our parent process, over a pipe)
        except EOFError:
            return
        try:
            reply: tuple[str, Any] = ("ok", compile_fields(load_kernel(path, name), *rest))
        except Exception as exc:  # the parent raises it as its own compile error
            reply = ("error", f"{type(exc).__name__}: {exc}")
        pickle.dump(reply, replies)
        replies.flush()


if __name__ == "__main__":
    serve()
