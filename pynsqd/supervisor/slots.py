"""One shard's place in the supervisor: its process, control channel, heartbeat and back-off
(and, while a reload replaces it, its successor).

A slot outlives the processes that fill it: a restarted shard gets the same index (so the
same topics, rings and heartbeat page). ``schedule_restart`` doubles the delay for each
death that came within ``STABLE_AFTER`` of a start (0.1 s, 0.2 s … ``BACKOFF_MAX``, with
jitter: ``pynsqd.backoff``) and resets it after a shard that ran long enough.
"""

from __future__ import annotations

import asyncio

from pynsqd.backoff import Backoff
from pynsqd.node.control import ControlChannel
from pynsqd.node.heartbeat import Heartbeat

BACKOFF_MIN = 0.1
BACKOFF_MAX = 10.0
STABLE_AFTER = 10.0


class Successor:
    """A process started to replace a slot's shard (``reload.py``), until it takes the slot."""

    def __init__(self, pid: int, channel: ControlChannel) -> None:
        self.pid = pid
        self.channel = channel
        self.standby = asyncio.Event()  # it booted and waits for the handover
        self.ready = False  # it said ``Ready`` (before the slot was switched to it)
        self.version = ""  # the pynsqd it runs, from its ``Ready``
        self.gone = asyncio.Event()  # it died


class Slot:
    """Shard ``index`` of the node."""

    def __init__(self, index: int, heartbeat: Heartbeat | None = None) -> None:
        self.index = index
        self.pid = 0
        self.channel: ControlChannel | None = None
        self.ready = asyncio.Event()
        self.restarts = 0
        self.version = ""  # the pynsqd its process runs, from its ``Ready``
        self.started = 0.0
        self.respawn_at: float | None = None
        self.abort_sent: float | None = None
        self.stalled = False  # no beat for heartbeat.STALL_AFTER: alive, but its loop is not turning
        self.spawn_failing = False  # the last restart could not start a process (logged once)
        self._restarts = Backoff(BACKOFF_MIN, BACKOFF_MAX)  # deaths that came soon after a start
        self.heartbeat = heartbeat or Heartbeat.create(index)  # given: a running shard's (``upgrade.py``)
        self.successor: Successor | None = None  # a process replacing this one (``reload.py``)
        self.draining = False  # being replaced: no new HTTP connection
        self.swapping = False  # its state moves to the successor: calls to it wait for it

    @property
    def is_ready(self) -> bool:
        return self.ready.is_set()

    @property
    def first_boot(self) -> bool:
        """Started and not ready yet, never restarted: the node waits for it (``Supervisor``)."""
        return bool(self.pid) and not self.restarts and not self.is_ready

    @property
    def takes_connections(self) -> bool:
        """Ready, reachable and beating: a new connection handed to it will be served now."""
        return (self.is_ready and not self.stalled and not self.draining and self.channel is not None
                and not self.channel.closed)

    def take(self, successor: Successor, now: float) -> None:
        """The successor serves this slot from now on."""
        self.pid = successor.pid
        self.channel = successor.channel
        self.started = now
        self.abort_sent = None
        self.successor = None
        self.version = successor.version
        self.reset_heartbeat()
        if successor.ready:
            self.ready.set()

    def reset_heartbeat(self) -> None:
        self.heartbeat.beat()
        self.stalled = False

    def last_beat(self) -> float:
        return self.heartbeat.last()

    def died(self) -> None:
        """The process is gone (reaped)."""
        self.pid = 0
        self.ready.clear()
        self.abort_sent = None
        self.stalled = False
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def schedule_restart(self, now: float) -> float:
        """When to start this shard again; returns the delay."""
        if now - self.started >= STABLE_AFTER:
            self._restarts.reset()
        delay = self._restarts.failed()
        self.respawn_at = now + delay
        return delay
