"""A service's process ends soon after its graceful shutdown finished, whatever is left.

After `shutdown_finished` the process still had to get past two joins that wait
without a bound, then the interpreter's teardown: `asyncio.Runner.close()`
joins the loop's default executor (an `asyncio.to_thread` call that is blocked
keeps it waiting); the interpreter's exit joins every non-daemon thread,
`ThreadPoolExecutor` workers included, even of pools shut down without waiting
(a grammar compile past its time limit runs on to its end in its thread); and
the teardown of the modules took 2 to 7 s of an idle CPU executor's stop with
torch imported. Any of them could keep a stopped executor alive until it was
killed.

So `run_service` arms `exit_after(code, seconds)` before the runner's close:
should that close still be running `seconds` later, a daemon thread logs
`exit_forced` with the threads that held it, each with the line it is blocked
on, and ends the process with `code`. Then `end_process(code)` names the
threads left running (`threads_left`), flushes the logs and ends the process
at once (`os._exit`): the graceful stop has already closed what needs closing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn

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


def _stack(frame, depth: int = 6) -> list[str]:
    """The innermost `depth` frames, outermost first."""
    frames: list[str] = []
    while frame is not None and len(frames) < depth:
        frames.append(_where(frame))
        frame = frame.f_back
    return frames[::-1]


def end_process(code: int) -> NoReturn:
    """End the process now with `code`, after flushing the logs (no interpreter teardown).
    Threads still running are named in a `threads_left` warning: they are not waited for."""
    left = holding_threads()
    if left:
        log.warning("threads_left", threads=left)
    _exit(code)


def _exit_when_late(code: int, seconds: float) -> None:
    threading.Event().wait(seconds)
    main = sys._current_frames().get(threading.main_thread().ident or 0)
    log.error(
        "exit_forced",
        after_seconds=seconds,
        main_thread=[] if main is None else _stack(main),
        threads=holding_threads(),
    )
    _exit(code)


def _exit(code: int) -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to save
            stream.flush()
    os._exit(code)
