"""Signals on a running event loop, handled one way in every process of pynsqd.

A handler only records the signal (``signals_to``); the process's own loop acts on it: a
daemon's ``StopRequest`` (``daemon.py``), the supervisor's queue of signals
(``supervisor/arbiter.py``), a utility's stop event (``tools/common.run``), a shard's stop
(``shard/worker.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator


@contextlib.contextmanager
def signals_to(record: Callable[[int], object], signals: Iterable[int]) -> Iterator[None]:
    """On the running loop, until the block ends: each of ``signals`` calls ``record(signum)``."""
    loop = asyncio.get_running_loop()
    chosen = tuple(signals)
    for signum in chosen:
        loop.add_signal_handler(signum, record, int(signum))
    try:
        yield
    finally:
        for signum in chosen:
            loop.remove_signal_handler(signum)
