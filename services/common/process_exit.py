"""A service's process exits soon after its graceful shutdown finished, whatever is left.

After `shutdown_finished` the process still has to get past two joins that wait
without a bound: `asyncio.Runner.close()` joins the loop's default executor (a
thread of `asyncio.to_thread` that is blocked keeps it waiting), and the
interpreter's exit joins every non-daemon thread, `ThreadPoolExecutor` workers
included, even of pools that were shut down without waiting (a grammar compile
past its time limit runs on to its end in its thread). Either one kept an
executor process alive after its stop until it was killed.

`exit_after(code, seconds)` arms a daemon thread before those joins: should the
process still be alive `seconds` later, it logs the threads that held it, each
with the line it is blocked on, and ends the process with `code` (`os._exit`:
no more joins, the graceful stop has already run).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from services.common.logging import get_logger

log = get_logger(__name__)

EXIT_SECONDS = 2.0
"""How long a process may take to exit once its service's shutdown finished."""


def exit_after(code: int, seconds: float = EXIT_SECONDS) -> threading.Thread:
    """Arm the exit deadline (see the module docstring); returns its daemon thread."""
    watchdog = threading.Thread(
        target=_exit_when_late, args=(code, seconds), name="exit-deadline", daemon=True
    )
    watchdog.start()
    return watchdog


def holding_threads() -> list[str]:
    """The threads an exit would wait for, as "name (file:line in function)"."""
    frames = sys._current_frames()
    held = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon or thread.ident is None:
            continue
        frame = frames.get(thread.ident)
        where = "" if frame is None else f" ({_where(frame)})"
        held.append(f"{thread.name}{where}")
    return held


def _where(frame) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


def _exit_when_late(code: int, seconds: float) -> None:
    threading.Event().wait(seconds)
    main = sys._current_frames().get(threading.main_thread().ident or 0)
    log.error(
        "exit_forced",
        after_seconds=seconds,
        main_thread=None if main is None else _where(main),
        threads=holding_threads(),
    )
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to save
            stream.flush()
    os._exit(code)
