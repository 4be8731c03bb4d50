"""Helpers for tests that drive a ``MessageQueue`` as a shard does."""

from __future__ import annotations

from pynsqd.shard.queue import MessageQueue
from pynsqd.shm.logrecovery import Deferred


def recover(queue: MessageQueue) -> Deferred:
    """What a restarted shard does with a queue a previous process left, all at once:
    ``start_recovery``, then ``recover_step`` until the log is walked; the deferred messages."""
    deferred = queue.start_recovery()
    while queue.scanning:
        deferred += queue.recover_step(1 << 20)
    return deferred
