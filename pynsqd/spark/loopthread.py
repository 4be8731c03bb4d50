"""One asyncio event loop on a daemon thread, for the synchronous code Spark calls.

Spark calls data source methods synchronously (the driver-side runner, executor tasks), while
``pynsqd.client`` is asyncio. A ``LoopThread`` runs one loop for the life of the process;
``call(coro)`` runs a coroutine there and blocks for its result, and ``soon(fn)`` schedules a
plain callback. One per process (``shared()``): executor Python workers are reused across
tasks, so their NSQ connections are kept here as an optimisation only — never delivery state.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "pynsqd-spark-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (or exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


_shared: LoopThread | None = None
_lock = threading.Lock()


def shared() -> LoopThread:
    """This process's loop thread, started on first use."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = LoopThread()
        return _shared
