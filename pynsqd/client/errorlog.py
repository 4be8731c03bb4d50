"""Logging nsqd's non-fatal errors without one line per message.

nsqd answers a FIN, REQ or TOUCH it cannot apply with ``E_FIN_FAILED``/``E_REQ_FAILED``/
``E_TOUCH_FAILED`` (the message timed out and went back to the queue, or it is owned by
another connection). Under message timeouts that is one error per message: thousands in a
second. ``ErrorSummary`` is a connection's ``on_error``: it counts every error per code
(``counts``), logs the first of a burst at once, and holds the rest: one line per code
every ``interval`` seconds while they keep coming ("N more E_TOUCH_FAILED ..., last: ..."),
and one when the connection closes (``close``). A quiet ``interval`` ends the burst, so the
next error is logged at once again. Runs on the connection's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pynsqd.client.errors import ResponseError

log = logging.getLogger("pynsqd.client")

SUMMARY_INTERVAL = 10.0  # seconds


class ErrorSummary:
    """The ``on_error`` of one connection (see the module doc); ``on_count`` is called once
    per error (e.g. to count it in the consumer's stats)."""

    def __init__(self, address: str, interval: float = SUMMARY_INTERVAL,
                 on_count: Callable[[ResponseError], None] | None = None) -> None:
        self.address = address
        self.interval = interval
        self.on_count = on_count
        self.counts: dict[str, int] = {}  # every error seen, per code
        self._held: dict[str, tuple[int, ResponseError]] = {}  # per code: not logged yet, the last one
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, error: ResponseError) -> None:
        self.counts[error.code] = self.counts.get(error.code, 0) + 1
        if self.on_count is not None:
            self.on_count(error)
        if self._timer is None:  # the first of a burst
            log.warning("%s: %s", self.address, error)
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)
            return
        held = self._held.get(error.code)
        self._held[error.code] = (1 if held is None else held[0] + 1, error)

    def _tick(self) -> None:
        self._timer = None
        if self._held:  # still coming: report them, stay in the burst
            self.flush()
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def flush(self) -> None:
        """Log what is held: one line per code."""
        for code, (count, last) in self._held.items():
            log.warning("%s: %d more %s since the last report (%d in all; last: %s)", self.address, count,
                        code, self.counts[code], last)
        self._held.clear()

    def close(self) -> None:
        """The connection is gone: report what is held, stop the timer."""
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
