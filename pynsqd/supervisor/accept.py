"""The supervisor's accept loop, one shape for every listener (TCP, HTTP, HTTPS).

Theory of operation
-------------------
An ``Acceptor`` watches one listening socket with the loop's reader callback. Each wake-up
accepts what is queued (up to ``ACCEPT_BATCH``) and passes the batch to its hand-off, which
decides where the connections go: TCP connections to ``handoff.greet`` (the topic's owner,
``arbiter.py``), HTTP and HTTPS connections to the shards in turn (``httpaccept.py``). A
hand-off that cannot take connections now (``ready`` is false: every shard booting or
stalled) pauses the listener for ``STALL_POLL``; connections wait in the kernel's backlog.

An accept that fails for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) —
or for any other reason but a connection that died in the backlog — never ends the loop:
the listener is paused for ``RETRY_MIN`` seconds, doubling up to ``RETRY_MAX`` while the
failures go on (as Go's ``net/http`` server does; with jitter, ``pynsqd.backoff``), and tried
again; the connections wait in
the backlog meanwhile. A spell of failures is logged once when it begins and once when
accepting works again, so a node out of descriptors neither spins nor floods its log, and
serves as soon as descriptors are free.

The last ``RESERVE`` descriptors under the limit (a quarter of it at most) are never spent on
accepted connections: a shard replaced by a new one hands its connections over through this
process (``reload.py``), up to ``MAX_FDS`` in one message, and a receiver without room for
them would lose them. Descriptors are allocated lowest first, so the number a ``dup`` gets is
the next one an accept would get: each wake-up starts with that probe, and a wake-up whose
next descriptor is in the reserve backs off as a failed accept does; within a wake-up the
connection given the last number below the reserve is the last accepted. A connection is
never accepted only to be closed: past the ceiling it waits in the backlog.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
from collections.abc import Callable

from pynsqd.backoff import Backoff
from pynsqd.node.control import MAX_FDS

log = logging.getLogger("pynsqd.supervisor")

ACCEPT_BATCH = 64  # connections accepted per wake-up at most (within one control message: MAX_FDS)
STALL_POLL = 0.2  # seconds between looks while the hand-off cannot take connections
RETRY_MIN = 0.005  # seconds before the first retry after a failed accept
RETRY_MAX = 1.0  # the longest pause between retries
_DEAD_IN_BACKLOG = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR}  # skip it, accept the next
RESERVE = MAX_FDS + 32  # descriptors kept free for connections handed between processes, and pipes


def descriptor_ceiling() -> int | None:
    """The lowest descriptor number an accepted connection may not have (None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - min(RESERVE, soft // 4)

Accepted = list[tuple[socket.socket, tuple[object, ...]]]
HandOff = Callable[[Accepted], None]


def _always() -> bool:
    return True


class Acceptor:
    """Accepts from ``listener`` (named ``name`` in the log) and passes each batch of
    connections to ``hand_off``, while ``ready()`` says it can take them."""

    def __init__(self, name: str, listener: socket.socket, hand_off: HandOff,
                 ready: Callable[[], bool] = _always) -> None:
        self.name = name
        self.listener = listener
        self.hand_off = hand_off
        self.ready = ready
        self.retry = Backoff(RETRY_MIN, RETRY_MAX)  # its failures: the accepts failed in this spell
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = listener.fileno()
        self._paused: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.listener.setblocking(False)
        loop.add_reader(self._fd, self._readable)

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        else:
            self._loop.remove_reader(self._fd)
        self._loop = None

    def _pause(self, delay: float) -> None:
        """Stop reading for ``delay`` seconds; connections wait in the backlog."""
        assert self._loop is not None
        self._loop.remove_reader(self._fd)
        self._paused = self._loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._loop is not None:
            self._loop.add_reader(self._fd, self._readable)
            self._readable()

    def _failed(self, exc: OSError) -> None:
        if not self.retry.failures:
            log.error("%s: accept failed - %s; retrying with back-off until it works", self.name, exc)
        self._pause(self.retry.failed())

    def _next_descriptor(self) -> int:
        """The number the next accepted connection would get (the lowest free one)."""
        probe = os.dup(self._fd)
        os.close(probe)
        return probe

    def _readable(self) -> None:
        if not self.ready():
            self._pause(STALL_POLL)
            return
        batch: Accepted = []
        ceiling = descriptor_ceiling()  # read each time: an operator may change the limit (prlimit)
        if ceiling is not None and self._next_descriptor() >= ceiling:
            self._failed(OSError(errno.EMFILE, f"Too many open files ({ceiling} in use; the rest are kept "
                                               "for connections handed between processes)"))
            return
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self.listener.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in _DEAD_IN_BACKLOG:
                    continue
                self._failed(exc)
                break
            if self.retry.failures:
                log.info("%s: accepting again after %d failed attempt(s)", self.name, self.retry.failures)
                self.retry.reset()
            batch.append((conn, addr))
            if ceiling is not None and conn.fileno() >= ceiling - 1:
                break  # the next one would be in the reserve: the next wake-up's probe says so
        if batch:
            self.hand_off(batch)
