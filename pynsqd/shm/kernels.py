"""The per-record loops of a ``MessageLog``: the compiled ``pynsqd.shm._logscan`` when it was
built (``setup.py`` builds it where Cython and a C compiler are at hand), else the pure-Python
``pynsqd.shm.logscan``; both give the same results byte for byte. ``PYNSQD_PURE=1`` in the
environment forces the pure functions (the test suite runs on both). ``COMPILED`` says which
are in use."""

from __future__ import annotations

import os

from pynsqd.shm import logscan

COMPILED = False
find = logscan.find
deliver_run = logscan.deliver_run
deliver_ready = logscan.deliver_ready
release_front = logscan.release_front

if os.environ.get("PYNSQD_PURE", "") in ("", "0"):
    try:
        from pynsqd.shm import _logscan
    except ImportError:  # not built: the pure functions stay
        pass
    else:
        find = _logscan.find
        deliver_run = _logscan.deliver_run
        deliver_ready = _logscan.deliver_ready
        release_front = _logscan.release_front
        COMPILED = True

__all__ = ["COMPILED", "deliver_ready", "deliver_run", "find", "release_front"]
