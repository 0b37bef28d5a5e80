"""Frozen weights: a function compiled with some of its inputs bound as constants, checked by identity.

Under `torch.compile(backend="opgen")` Dynamo passes a module's parameters and buffers as graph
inputs on every call. Freezing (`opgen.runtime.frontend.dynamo`) compiles the graph with the ones
it does not write bound as constants, so batch-norm folding, weight prepacking and constant
folding run once, when the function is bound, instead of never. Dynamo does not guard the
identity of those tensors: a module whose parameter was replaced by a new tensor, or another
instance of the same class, runs the same compiled code with its own tensors. So the function
made here checks on every call that the frozen positions hold the very tensors it was bound to
(one `is` per tensor, in C), and binds the compiled graph again for tensors it has not seen: its
shapes, strides and dtypes are the same (Dynamo guards those), only the constants differ. It
keeps the last `KEEP` bindings, most recent first, so alternating between a few models does not
rebind on every call.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

Compiled = Callable[..., Any]
KEEP = 4  # bindings kept for other tensors at the frozen positions (another module instance, replaced weights)


def _taker(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """`args -> tuple(args[i] for i in positions)`, at C speed for any count."""
    if len(positions) == 0:
        return lambda args: ()
    if len(positions) == 1:
        (only,) = positions
        return lambda args: (args[only],)
    return operator.itemgetter(*positions)


def frozen_function(
    make: Callable[[tuple[torch.Tensor, ...]], Compiled],
    frozen: Sequence[int],
    kept: Sequence[int],
    tensors: Sequence[torch.Tensor],
) -> Compiled:
    """A function taking every input that runs `make(tensors)` (a function of the `kept` inputs alone).

    `frozen`: the input positions bound as constants; `tensors`: the tensors bound there first.
    A call passing other tensors at a frozen position runs `make(those tensors)`, bound once and kept.
    """
    if len(frozen) != len(tensors):
        raise ValueError(f"frozen_function: {len(frozen)} frozen positions but {len(tensors)} tensors")
    take_frozen, take_kept = _taker(frozen), _taker(kept)
    first = tuple(tensors)
    bindings: list[tuple[tuple[torch.Tensor, ...], Compiled]] = [(first, make(first))]
    lock = threading.Lock()

    def rebind(current: tuple[torch.Tensor, ...]) -> Compiled:
        with lock:  # threads bringing the same new tensors bind them once
            for i, (bound, fn) in enumerate(bindings):
                if all(map(operator.is_, current, bound)):
                    if i:  # never empties the list: calls read bindings[0] without the lock
                        bindings.insert(0, bindings.pop(i))
                    return fn
            with torch.no_grad():  # setup folds and packs the new constants
                fn = make(current)
            bindings.insert(0, (current, fn))
            del bindings[KEEP:]
            return fn

    def call(*args: Any) -> Any:
        bound, fn = bindings[0]
        current = take_frozen(args)
        if not all(map(operator.is_, current, bound)):
            fn = rebind(current)
        return fn(*take_kept(args))

    call.bindings = bindings  # type: ignore[attr-defined]  # for report() and tests: (tensors, function), newest first
    return call
