"""What opgen's commands (`python -m opgen.bench`, `python -m opgen.generate`) share: their output may go to a
reader that stops early (`| head`), which ends them quietly, as it ends Unix tools."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

SIGPIPE_STATUS = 141  # the status of a process that SIGPIPE ended (128 + 13)


def until_reader_leaves(command: Callable[[], int]) -> int:
    """`command()`'s status; where its output's reader has gone, SIGPIPE's status and no traceback."""
    try:
        status = command()
        sys.stdout.flush()  # here, not at exit: a reader that is gone shows as the error below
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return SIGPIPE_STATUS
