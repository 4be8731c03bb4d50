"""The compiled kernels and their pure-Python twins: for the log's per-record loops
(``find``, ``deliver_run``, ``deliver_ready``, ``release_front``), the compiled
``pynsqd.shm._logscan`` when it was built (``setup.py`` builds it, and the MPUB scan
``pynsqd.wire._mpubscan``, where Cython and a C compiler are at hand), else the pure-Python
``pynsqd.shm.logscan``; both give the same results byte for byte. ``PYNSQD_PURE=1`` in the
environment forces the pure functions everywhere (the test suite runs on both). ``COMPILED``
says which are in use."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from pynsqd.shm import logscan

PURE = os.environ.get("PYNSQD_PURE", "") not in ("", "0")


def compiled_twin(name: str) -> ModuleType | None:
    """The compiled module ``name``; None when it is not built or ``PYNSQD_PURE`` is set."""
    if PURE:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: the pure functions serve
        return None


_twin = compiled_twin("pynsqd.shm._logscan")
COMPILED = _twin is not None
find = logscan.find if _twin is None else _twin.find
deliver_run = logscan.deliver_run if _twin is None else _twin.deliver_run
deliver_ready = logscan.deliver_ready if _twin is None else _twin.deliver_ready
release_front = logscan.release_front if _twin is None else _twin.release_front

__all__ = ["COMPILED", "PURE", "compiled_twin", "deliver_ready", "deliver_run", "find", "release_front"]
