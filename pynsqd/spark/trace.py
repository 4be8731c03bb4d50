"""Opt-in timeline of the streaming source: ``PYNSQD_SPARK_TRACE=dir``.

Each process that runs part of the source (the driver-side runner, executor Python workers)
appends ``monotonic-seconds event key=value ...`` lines to ``dir/<pid>.trace``. The clock is
CLOCK_MONOTONIC, which every process on one host shares, so the files merge into one timeline:
``bench/spark_timeline.py`` prints where each micro-batch's time went. Spark starts its Python
processes with the driver's environment, so setting the variable before the session starts
traces all of them. Unset (the default), ``event`` is one global lookup.
"""

from __future__ import annotations

import os
import time
from typing import IO, Any

ENV = "PYNSQD_SPARK_TRACE"
_dir: str | None = None  # None: the environment not read yet; "": tracing off
_file: IO[str] | None = None


def enabled() -> bool:
    global _dir
    if _dir is None:
        _dir = os.environ.get(ENV, "")
    return bool(_dir)


def event(name: str, **fields: Any) -> None:
    """Record ``name`` with ``fields`` at the current monotonic time (when tracing is on)."""
    global _file
    if not enabled():
        return
    if _file is None:
        assert _dir
        os.makedirs(_dir, exist_ok=True)
        # kept open (line-buffered) for the life of the process
        _file = open(os.path.join(_dir, f"{os.getpid()}.trace"), "a", buffering=1)
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    _file.write(f"{time.monotonic():.6f} {name} {extra}\n")


def reset() -> None:
    """Read the environment again at the next event (for tests)."""
    global _dir, _file
    if _file is not None:
        _file.close()
    _dir, _file = None, None
