"""A runtime-based service that leaves something blocked when it stops, for test_runtime_exit.py.

    python stuck_service.py PORT GRACE_SECONDS {nothing,to_thread,pool,thread}

to_thread: an `asyncio.to_thread` call that never returns (the runner's close joins it);
pool: a ThreadPoolExecutor job that never ends, the pool shut down without waiting (the
interpreter's exit joins its worker); thread: a plain non-daemon thread that never ends.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from services.common.config import ServerConfig
from services.common.logging import configure_logging
from services.common.server import ServiceRuntime, run_service

NEVER = threading.Event()


async def main(port: int, grace_seconds: float, left: str) -> int:
    configure_logging("stuck_test")
    runtime = ServiceRuntime(ServerConfig(name="stuck_test", port=port, grace_seconds=grace_seconds))
    await runtime.start(lambda server: None, [])
    blocked = []
    if left == "to_thread":
        blocked.append(asyncio.ensure_future(asyncio.to_thread(NEVER.wait)))
    elif left == "pool":
        pool = ThreadPoolExecutor(1, thread_name_prefix="stuck-pool")
        pool.submit(NEVER.wait)
        pool.shutdown(wait=False)
    elif left == "thread":
        threading.Thread(target=NEVER.wait, name="stuck-thread").start()
    runtime.set_serving()

    async def on_shutdown() -> None:
        for task in blocked:
            task.cancel()  # the task ends; its thread does not

    await runtime.serve_until_signal(on_shutdown)
    return 0


if __name__ == "__main__":
    sys.exit(run_service(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])))
