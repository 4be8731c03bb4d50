"""The log's per-record loops (``find``, ``deliver_run``, ``deliver_ready``,
``release_front``, ``recover_run``, ``live_ids``) and its one-record append (``put_one``):
the compiled ``pynsqd.shm._logscan`` when it was built, else the pure-Python
``pynsqd.shm.logscan``; both give the same results byte for byte (``pynsqd.compiled``:
``PYNSQD_PURE=1`` forces the pure ones). ``COMPILED`` says which are in use."""

from __future__ import annotations

from pynsqd.compiled import compiled_twin
from pynsqd.shm import logscan

_twin = compiled_twin("pynsqd.shm._logscan")
COMPILED = _twin is not None
find = logscan.find if _twin is None else _twin.find
deliver_run = logscan.deliver_run if _twin is None else _twin.deliver_run
deliver_ready = logscan.deliver_ready if _twin is None else _twin.deliver_ready
release_front = logscan.release_front if _twin is None else _twin.release_front
recover_run = logscan.recover_run if _twin is None else _twin.recover_run
live_ids = logscan.live_ids if _twin is None else _twin.live_ids
put_one = logscan.put_one if _twin is None else _twin.put_one

__all__ = ["COMPILED", "deliver_ready", "deliver_run", "find", "live_ids", "put_one", "recover_run",
           "release_front"]
