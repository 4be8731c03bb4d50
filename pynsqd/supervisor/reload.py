"""Rolling restart: every shard replaced by a new process, one at a time (SIGHUP).

Theory of operation
-------------------
``systemctl reload`` (SIGHUP to the supervisor) reads the command line and its ``--config``
file again and, when they are valid, replaces each shard's process in turn with one running
the code installed now and the options read now. Options that the listeners, the data path or
the shared memory already committed to (``FIXED``) cannot change this way: a reload that
changes one is refused as a whole, with one line naming it, and the node runs on as it was.
TLS files may change (certificate rotation) but TLS cannot be turned on or off.

Replacing shard *i* (``replace``; the shard's side is ``shard/handover.py``):

1. a *standby* worker for *i* is started and boots all it can without the shard's queues,
   then says ``Standby`` (the old process serves as before meanwhile);
2. ``Drain`` to the old process: the supervisor hands it no new HTTP connection, and it gives
   its idle ones back (to the other shards, ``HTTPAcceptor.give``) and lets the others finish,
   while still serving TCP;
3. ``Release``: the slot stops taking TCP connections (they wait for ``ready``) and calls
   that need the shard wait for its replacement; the old process sends its state and
   connections as ``Handover`` parts, which are relayed to the replacement as they come, and
   exits; the slot is switched to the replacement, which says ``Ready`` once it serves.

A replacement that dies or does not come up in time leaves the old process serving (the
reload of that shard is abandoned and logged); an old process that dies during the drain is
a crash like any other (the replacement is stopped, the slot restarts with back-off). A
reload asked for while one runs runs once more after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from pynsqd import sdnotify
from pynsqd.node.config import NsqdOptions, parse_args
from pynsqd.node.control import ControlChannel
from pynsqd.node.messages import ControlMessage, Drain, Failed, Handover, Ready, Release, Standby
from pynsqd.node.tls import build_server_context
from pynsqd.options import UsageError
from pynsqd.supervisor.httpaccept import HTTPAcceptor
from pynsqd.supervisor.slots import Slot, Successor

log = logging.getLogger("pynsqd.supervisor")

# what a running node has committed to: a reload that changes one is refused
FIXED = ("tcp_address", "http_address", "https_address", "data_path", "shards", "node_id", "mem_queue_bytes",
         "max_msg_size", "broadcast_address", "broadcast_tcp_port", "broadcast_http_port", "log_prefix")
STANDBY_WAIT = 60.0  # seconds for a replacement to boot
DRAIN_WAIT = 5.0  # seconds an old process gives busy HTTP connections to finish
RELEASE_WAIT = 30.0  # seconds for an old process to hand its state over
READY_WAIT = 120.0  # seconds for a replacement to serve once it has the state
RECOVERY_WAIT = 60.0  # seconds an old process may still need to recover its logs after a crash


def reread(argv: list[str], current: NsqdOptions) -> NsqdOptions | None:
    """The options ``argv`` (and its ``--config``) give now, or None (logged) when they are
    invalid or change what cannot change."""
    try:
        new, _ = parse_args(argv)
    except UsageError as exc:
        log.error("reload refused: %s; the node runs on unchanged", exc)
        return None
    fixed = [name for name in FIXED if getattr(new, name) != getattr(current, name)]
    if bool(new.tls_cert) != bool(current.tls_cert):
        fixed.append("tls_cert")
    if fixed:
        flags = ", ".join("--" + name.replace("_", "-") for name in fixed)
        log.error("reload refused: %s cannot change without a restart; the node runs on unchanged", flags)
        return None
    try:
        build_server_context(new)
    except (OSError, ssl.SSLError) as exc:
        log.error("reload refused: failed to load TLS certificate/key: %s; the node runs on unchanged", exc)
        return None
    return new


def changed(old: NsqdOptions, new: NsqdOptions) -> list[str]:
    return [f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)]


class Operation:
    """Something the supervisor does on a signal, as one task at a time."""

    name = ""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    def begin(self, run: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Start ``run()`` as the task; False if one runs already."""
        if self.task is not None:
            return False
        self.task = asyncio.get_running_loop().create_task(run())
        self.task.add_done_callback(self._done)
        return True

    def _done(self, task: asyncio.Task[None]) -> None:
        self.task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed - %r", self.name, task.exception())

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


class Reloaded(Protocol):
    """What a reload needs from the supervisor (``arbiter.Supervisor``)."""

    argv: list[str]  # the command line, read again
    opts: NsqdOptions
    slots: list[Slot]
    http_acceptor: HTTPAcceptor

    @property
    def stopping(self) -> bool: ...

    def apply_options(self, new: NsqdOptions, names: list[str]) -> None:
        """Change the options ``names`` to ``new``'s."""

    def launch(self, index: int, standby: bool = False) -> tuple[int, ControlChannel]:
        """Start a worker for shard ``index``: its pid and control channel."""

    def status(self) -> str:
        """The ``STATUS=`` line for systemd."""


class Reloader(Operation):
    """Runs rolling restarts for one supervisor."""

    name = "reload"

    def __init__(self, sup: Reloaded) -> None:
        super().__init__()
        self.sup = sup
        self.again = False
        self.reloads = 0  # completed rolling restarts
        self.replaced = 0  # shards replaced by them
        self.retiring: set[int] = set()  # pids of replaced processes not yet reaped

    # --- requests -------------------------------------------------------------------------
    def request(self) -> None:
        """SIGHUP: reload now, or once more after the one running."""
        if not self.begin(self._run):
            self.again = True
            log.info("reload requested while one runs: it runs again after")

    async def _run(self) -> None:
        while True:
            self.again = False
            await self.reload()
            if not self.again or self.sup.stopping:
                return

    def stop(self) -> None:
        """The node stops: abandon a reload under way (its replacement, if any, is killed)."""
        self.cancel()
        for slot in self.sup.slots:
            if slot.successor is not None:
                self.abandon(slot)

    # --- one reload -----------------------------------------------------------------------
    async def reload(self) -> None:
        sup = self.sup
        log.info("reloading: reading the options again and replacing every shard, one at a time")
        new = reread(sup.argv, sup.opts)
        if new is None:
            return
        names = changed(sup.opts, new)
        if names:
            log.info("reload: changing %s", ", ".join("--" + n.replace("_", "-") for n in names))
        sup.apply_options(new, names)
        started = time.monotonic()
        sdnotify.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}",
                        "STATUS=reloading: replacing the shards one at a time")
        replaced = 0
        try:
            for slot in sup.slots:
                if sup.stopping:
                    return
                if await self.replace(slot):
                    replaced += 1
            self.reloads += 1
            self.replaced += replaced
            log.info("reloaded: %d of %d shard(s) replaced in %.2fs", replaced, len(sup.slots),
                     time.monotonic() - started)
        finally:
            if not sup.stopping:
                sdnotify.notify("READY=1", sup.status())

    async def replace(self, slot: Slot) -> bool:
        """Replace the process of ``slot`` (see the module doc); True once the new one serves."""
        sup = self.sup
        old = slot.channel
        if not slot.is_ready or old is None or old.closed:
            log.warning("shard %d: not serving; not replaced (it restarts on its own)", slot.index)
            return False
        try:
            pid, channel = sup.launch(slot.index, standby=True)
        except OSError as exc:
            log.error("shard %d: cannot start its replacement - %s", slot.index, exc)
            return False
        successor = slot.successor = Successor(pid, channel)
        log.info("shard %d: replacement started (pid %d)", slot.index, pid)
        swapped = False
        released = 0  # the old process's pid, once it was told to release
        try:
            if not await _either(successor.standby, successor.gone, STANDBY_WAIT):
                log.error("shard %d: the replacement (pid %d) did not boot; shard %d runs on", slot.index, pid,
                          slot.index)
                return False
            began = time.monotonic()
            slot.draining = True
            drained = await old.call(Drain(DRAIN_WAIT), wait=DRAIN_WAIT + RECOVERY_WAIT + RELEASE_WAIT)
            if isinstance(drained, Failed):
                log.error("shard %d: not replaced now - %s", slot.index, drained.error)
                return False
            if successor.gone.is_set():
                log.error("shard %d: the replacement died; shard %d runs on", slot.index, slot.index)
                return False
            slot.ready.clear()  # new TCP connections for its topics wait for the replacement
            slot.swapping = True
            frozen = time.monotonic()
            old_pid = released = slot.pid
            await old.call(Release(), wait=RELEASE_WAIT)
            self.retiring.add(old_pid)
            slot.take(successor, time.monotonic())
            swapped = True
            if not await _either(slot.ready, successor.gone, READY_WAIT):
                log.error("shard %d: the replacement (pid %d) did not become ready; killing it", slot.index, pid)
                if slot.pid == pid:  # not reaped yet: reaped as a dead shard, restarted, recovering
                    _kill(pid)
                return False
            log.info("shard %d: replaced (pid %d -> %d): drained in %.3fs, handed over in %.3fs", slot.index,
                     old_pid, pid, frozen - began, time.monotonic() - frozen)
            return True
        except (ConnectionError, TimeoutError) as exc:
            log.error("shard %d: replacement failed - %s", slot.index, exc or type(exc).__name__)
            if released and not swapped and slot.pid == released:  # not reaped yet: it stopped serving,
                _kill(released)  # maybe half handed over: a crash (restarted, recovering its logs)
            return False
        finally:
            slot.draining = slot.swapping = False
            if not swapped:
                self.abandon(slot)
            sup.http_acceptor.flush()

    # --- from the supervisor --------------------------------------------------------------
    def from_successor(self, slot: Slot, msg: ControlMessage) -> bool:
        """A message from ``slot``'s replacement before it took the slot; True if handled here
        (else the supervisor's usual handler takes it: ``Snapshot``, ``Changed`` ...)."""
        successor = slot.successor
        assert successor is not None
        if isinstance(msg, Standby):
            successor.standby.set()
            return True
        if isinstance(msg, Ready):
            successor.ready = True
            successor.version = msg.version
            return True
        return False

    def relay(self, slot: Slot, msg: Handover, fds: list[int]) -> None:
        """A ``Handover`` part from the process being replaced: to its replacement."""
        successor = slot.successor
        try:
            if successor is None or successor.channel.closed:
                log.error("shard %d: a handover part with no replacement to take it", slot.index)
                return
            successor.channel.send(msg, fds)
        except ConnectionError:
            log.error("shard %d: the replacement is gone; its handover is lost", slot.index)
        finally:
            for fd in fds:
                os.close(fd)

    def reaped(self, pid: int, code: int) -> None:
        """A process that serves no slot exited: a replaced one, or a replacement."""
        if pid in self.retiring:
            self.retiring.discard(pid)
            if code:
                log.warning("replaced shard process %d exited with status %d", pid, code)
            return
        for slot in self.sup.slots:
            if slot.successor is not None and slot.successor.pid == pid:
                log.error("shard %d: its replacement (pid %d) exited with status %d", slot.index, pid, code)
                slot.successor.gone.set()
                slot.successor.channel.close()

    def abandon(self, slot: Slot) -> None:
        """Stop ``slot``'s replacement, if any (it is reaped as any child)."""
        successor, slot.successor = slot.successor, None
        if successor is None:
            return
        if not successor.gone.is_set():
            _kill(successor.pid)
            successor.gone.set()
            self.retiring.add(successor.pid)
        successor.channel.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def _either(event: asyncio.Event, failed: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event``; False if ``failed`` is set first or ``seconds`` pass."""
    wait = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(failed.wait())]
    try:
        await asyncio.wait(wait, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in wait:
            task.cancel()
    return event.is_set() and not failed.is_set()
