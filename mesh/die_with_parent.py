"""Exec a command that gets SIGTERM when its parent dies: `die_with_parent.py PARENT_PID CMD...`.

The supervisor starts its children through this launcher, so a supervisor that
is killed outright (no chance to stop them) still leaves no process behind.
Linux's parent-death signal (prctl PR_SET_PDEATHSIG) survives the exec;
elsewhere the command simply runs. PARENT_PID is the supervisor's pid: if it
is no longer the parent once the signal is armed, the parent died first and the
command is not run. Imports nothing heavy: it costs one bare interpreter start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: die_with_parent.py PARENT_PID COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent, argv = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 1
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
