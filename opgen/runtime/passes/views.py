"""View handling: take views without a kernel call where that is cheaper.

- `drop_identity_views`: `alias(x)` and views whose result has exactly the meta of their source
  are the source itself: the name is substituted, no call remains.
- `sink_reshapes`: a pointwise op whose tensor operands are all reshapes of same-shaped
  contiguous tensors, and whose result is only reshaped, runs on the un-reshaped tensors; the
  reshape back to the original shape then disappears (`(x.view(4, 4) + y.view(4, 4)).view(16)` is
  one `add(x, y)`). Reshape is value semantics on row-major order, so this holds for any layout
  the guard admits; operands must not broadcast.
- `hoist_views`: views of values that exist before the first call (constants, persistent buffers
  from memory planning) are taken once, in setup, instead of on every call.
"""

from __future__ import annotations

from dataclasses import replace

from opgen.runtime.ir import Arg, KernelCall, Line, Program, Ref, TensorMeta, defs, meta_table, substitute_line, uses
from opgen.runtime.passes.analysis import alias_sources, escaping, is_view_call, setup_names, use_counts
from opgen.runtime.registry import KernelRegistry

RESHAPES = frozenset({"view", "_unsafe_view", "reshape"})


def _rename_all(lines: list[Line], mapping: dict[str, Arg]) -> list[Line]:
    return [substitute_line(line, mapping) for line in lines]


def drop_identity_views(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    body: list[Line] = []
    mapping: dict[str, Arg] = {}
    for line in program.body:
        line = substitute_line(line, mapping)
        is_view = isinstance(line, KernelCall) and is_view_call(line, registry)
        if is_view and isinstance(line, KernelCall) and not line.unpack and len(line.outputs) == 1 and line.outputs[0]:
            source = alias_sources(line, registry)
            out = line.outputs[0]
            if len(source) == 1 and (
                line.kernel == "alias" or (out.meta is not None and out.meta == metas.get(source[0]))
            ):
                mapping[out.name] = Ref(source[0])
                continue
        body.append(line)
    return replace(program, body=tuple(body))


def _reshape_source(line: Line | None, counts: dict[str, int], metas: dict[str, TensorMeta]) -> str | None:
    """The source of a reshape call whose only reader is the pointwise op, if both are contiguous."""
    if not isinstance(line, KernelCall) or line.kernel not in RESHAPES or line.fallback or not line.outputs:
        return None
    out, source = line.outputs[0], line.args[0]
    if out is None or not isinstance(source, Ref) or counts[out.name] != 1:
        return None
    src_meta = metas.get(source.name)
    if src_meta is None or out.meta is None or not src_meta.is_contiguous() or not out.meta.is_contiguous():
        return None
    return source.name


def _sinkable(
    call: KernelCall, producers: dict[str, Line], counts: dict[str, int], metas: dict[str, TensorMeta]
) -> dict[str, str] | None:
    """{reshaped operand: its source} if `call` may run on the sources; None otherwise."""
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not call.pointwise or call.fallback or call.mutates or out is None or out.meta is None:
        return None
    operands = [a for a in call.args if isinstance(a, Ref)] + [v for _, v in call.kwargs if isinstance(v, Ref)]
    sources = {a.name: _reshape_source(producers.get(a.name), counts, metas) for a in operands}
    if not sources or None in sources.values():
        return None
    shapes = {metas[s].shape for s in sources.values() if s is not None}
    if len(shapes) != 1 or any(metas[r].shape != out.meta.shape for r in sources):
        return None
    return sources  # type: ignore[return-value]


def sink_reshapes(program: Program, registry: KernelRegistry) -> Program:
    metas = meta_table(program)
    counts = use_counts(program.body)
    producers = {v.name: line for line in program.body for v in defs(line)}
    readers: dict[str, list[KernelCall]] = {}
    for line in program.body:
        for name in {u for u in (a.name for a in getattr(line, "args", ()) if isinstance(a, Ref))}:
            readers.setdefault(name, []).append(line)  # type: ignore[arg-type]
    body: list[Line] = list(program.body)
    mapping: dict[str, Arg] = {}
    for i, line in enumerate(body):
        if not isinstance(line, KernelCall):
            continue
        sources = _sinkable(line, producers, counts, metas)
        out = line.outputs[0] if sources else None
        if not sources or out is None or out.meta is None:
            continue
        users = readers.get(out.name, [])
        if counts[out.name] != len(users) or not all(u.kernel in RESHAPES and not u.fallback for u in users):
            continue
        new_meta = out.meta.with_shape(metas[next(iter(sources.values()))].shape)
        body[i] = substitute_line(
            replace(line, outputs=(replace(out, meta=new_meta),)), {k: Ref(v) for k, v in sources.items()}
        )
        metas[out.name] = new_meta
        for user in users:
            user_out = user.outputs[0]
            if user_out is not None and user_out.meta is not None and user_out.meta.shape == new_meta.shape:
                mapping[user_out.name] = Ref(out.name)
    body = [line for line in body if not any(v.name in mapping for v in defs(line))]
    return replace(program, body=tuple(_rename_all(body, mapping)))


def hoist_views(program: Program, registry: KernelRegistry) -> Program:
    resident = setup_names(program)
    escapes = escaping(program, registry)
    setup, body = list(program.setup), []
    for line in program.body:
        sources = alias_sources(line, registry)
        names = [v.name for v in defs(line)]
        hoistable = is_view_call(line, registry) and sources and set(uses(line)) <= resident
        if hoistable and not set(names) & escapes:
            setup.append(line)
            resident.update(names)
        else:
            body.append(line)
    return replace(program, setup=tuple(setup), body=tuple(body))
