"""One shard's place in the supervisor: its process, control channel, heartbeat and back-off.

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


class Slot:
    """Shard ``index`` of the node."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.pid = 0
        self.channel: ControlChannel | None = None
        self.ready = asyncio.Event()
        self.restarts = 0
        self.started = 0.0
        self.respawn_at: float | None = None
        self.abort_sent: float | None = None
        self.stalled = False  # no beat for heartbeat.STALL_AFTER: alive, but its loop is not turning
        self.spawn_failing = False  # the last restart could not start a process (logged once)
        self._restarts = Backoff(BACKOFF_MIN, BACKOFF_MAX)  # deaths that came soon after a start
        self.heartbeat = Heartbeat.create(index)

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
        return self.is_ready and not self.stalled and self.channel is not None and not self.channel.closed

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
