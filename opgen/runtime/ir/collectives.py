"""The IR's record of a collective a program runs on a process group (`torch.distributed`).

A collective is two lines of the body, both `KernelCall(jit=True)` calling a callable bound at
load time from a `Collective` record:

    work_all_reduce = c10d_all_reduce(buf5)  # issue: writes buf5 (`mutates`), returns the Work
    ...                                      # compute that neither reads buf5 nor writes what the collective reads
    c10d_wait(work_all_reduce, buf5)          # wait: the Work, then every tensor in flight

The issue line writes its outputs (`mutates`) asynchronously; the wait line reads the Work and
lists every tensor the collective reads or writes, and names the outputs in its `mutates`. So a
tensor in flight is used until its wait: liveness, memory planning and frees see that without
knowing about collectives, and no pass moves a reader of an output above its wait.
Plain data, like the rest of `opgen.runtime.ir`.
"""

from __future__ import annotations

from dataclasses import dataclass

# What the records' `kind` may be: one per functional collective of `_c10d_functional`, "wait", and
# "one_shot_all_reduce" (a sum over peer memory, stream-ordered, no Work and no wait:
# `passes.one_shot_all_reduce`), "peer_sum" (the same through opgen's own kernel: `passes.peer_sum`) and
# "peer_gather" (an all-gather through opgen's own kernel, stream-ordered too: `passes.peer_gather`).
KINDS = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_coalesced", "reduce_scatter",
    "reduce_scatter_coalesced", "all_to_all", "broadcast", "wait", "one_shot_all_reduce",
    "peer_sum", "peer_gather",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Collective:
    """A callable the program binds to a process group, by the group's name, when it is loaded."""

    local: str  # the name generated code calls it by
    kind: str  # one of KINDS
    group: str = ""  # the process group's name as the graph records it ("" for "wait")
    group_size: int | None = None  # ranks the graph was traced for (None: not known when lowered)
    reduce_op: str = ""  # "sum", "avg", "product", "min", "max", "band", "bor", "bxor" (reductions)
    root: int = 0  # broadcast: the source rank
    node: str = ""  # the first graph node that uses it
    dtype: str = ""  # one_shot_all_reduce, peer_sum, peer_gather: the tensors' dtype ("bfloat16")
    numel: int = 0  # those kinds: elements of the largest tensor it reduces or sends (its buffer's size)


def issue_kinds(collectives: tuple[Collective, ...]) -> dict[str, str]:
    """Local name -> kind of every issuing callable (not the wait)."""
    return {c.local: c.kind for c in collectives if c.kind != "wait"}


def wait_locals(collectives: tuple[Collective, ...]) -> set[str]:
    return {c.local for c in collectives if c.kind == "wait"}
