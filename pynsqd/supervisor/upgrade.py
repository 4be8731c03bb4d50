"""Upgrading the supervisor itself (SIGUSR2): it re-executes the installed code in place.

Theory of operation
-------------------
nginx upgrades its binary on USR2 by starting a second master that inherits the listening
sockets. pynsqd's supervisor does it without a second process: it ``execve``s itself, so it
keeps its pid — systemd's ``MAINPID`` stays right and every shard keeps its parent — and
every descriptor that is not close-on-exec. The new image is told what they are in the
``ENV`` environment variable (``Inherited``): the listeners, the data path's lock (an
``flock`` belongs to the open file, which survives), each shard's pid, control socket and
heartbeat page, the inbound rings' eventfds, and the node's start time, log sizing and
counters. It builds the supervisor from them instead of binding and locking, lets the
shards go on, and then replaces them too (a rolling restart, ``reload.py``), so the whole
node runs the installed code.

The shards survive because they were spawned by the supervisor's main thread, which is the
one that calls ``execve``: ``PR_SET_PDEATHSIG`` fires when the thread that spawned a child
exits, and ``execve`` ends the process's *other* threads (the metadata writer's, the default
executor's), none of which spawned one.

Before the ``execve`` nothing may be left half done, since the new image starts from the
kernel's state alone (``quiesce``):

1. a *preflight*: the installed code imports and parses the command line, in two child
   processes (the supervisor's side and a shard's); if not, the upgrade is refused (logged)
   and the node runs on. The same options check as a reload applies;
2. no more accepting (connections wait in the kernel's backlog: none is refused); greetings
   under way hand their connection to a shard with what they read (``hurry``);
3. ``Hold`` to every shard: a shard sends nothing but replies until ``Resume``;
4. every hand-off is acknowledged, every call answered, every control message sent, the
   metadata written, the lookupd connections and statsd closed.

The new image sends each shard ``Resume`` (it sends what it held and its topics), accepts
again, registers with the lookupds again and starts the rolling restart. Between the two
images (a fresh interpreter's start, under a second) new connections wait in the backlog
and established ones are served by the shards throughout. The lookupds see the node's
registration connection close and open again: a consumer that asks them in that moment does
not find the node (its connections are not affected).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from typing import Protocol

import orjson

from pynsqd import sdnotify
from pynsqd.node.boot import ENV as WORKER_ENV
from pynsqd.node.boot import IMPORT_CHECK, same_code_command, worker_command
from pynsqd.node.config import NsqdOptions
from pynsqd.node.messages import Done, Hold, Resume
from pynsqd.shm.sizing import LogSizing
from pynsqd.supervisor import INHERITED_ENV
from pynsqd.supervisor.reload import Operation, Reloader, reread
from pynsqd.supervisor.slots import Slot

log = logging.getLogger("pynsqd.supervisor")

ENV = INHERITED_ENV  # the inherited state, for the new image
PREFLIGHT_WAIT = 60.0  # seconds for the preflight's processes
QUIESCE_WAIT = 10.0  # seconds for what is under way to finish before the execve
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)  # the supervisor's
CLI = "pynsqd.supervisor.cli"  # the module whose ``main`` the new image runs


@dataclasses.dataclass
class InheritedShard:
    index: int
    pid: int
    control_fd: int
    heartbeat_fd: int
    restarts: int
    version: str


@dataclasses.dataclass
class Inherited:
    """What the new image of the supervisor takes over (``ENV``, JSON)."""

    tcp_fd: int
    http_fd: int  # -1: none
    https_fd: int
    lock_fd: int
    owner_fd: int  # the shared memory's owner record, locked (``node/shmowner.py``)
    wake_fds: list[int]
    shards: list[InheritedShard]
    start_time: int
    start_ns: int
    log_sizing: LogSizing
    counters: dict[str, int]

    @property
    def fds(self) -> list[int]:
        return [fd for fd in (self.tcp_fd, self.http_fd, self.https_fd, self.lock_fd, self.owner_fd) if fd >= 0] + [
            *self.wake_fds, *(s.control_fd for s in self.shards), *(s.heartbeat_fd for s in self.shards)]

    def encode(self) -> str:
        return orjson.dumps(dataclasses.asdict(self)).decode()

    @classmethod
    def decode(cls, text: str) -> Inherited:
        raw = orjson.loads(text)
        raw["shards"] = [InheritedShard(**s) for s in raw["shards"]]
        raw["log_sizing"] = LogSizing(**raw["log_sizing"])
        return cls(**raw)

    @classmethod
    def from_environment(cls) -> Inherited | None:
        """The state a previous image left (removed from the environment), or None."""
        text = os.environ.pop(ENV, None)
        return None if text is None else cls.decode(text)

    def socket(self, fd: int) -> socket.socket | None:
        return None if fd < 0 else socket.socket(fileno=fd)


class Upgraded(Protocol):
    """What an upgrade needs from the supervisor (``arbiter.Supervisor``)."""

    argv: list[str]  # the command line the new image runs
    opts: NsqdOptions
    slots: list[Slot]

    @property
    def stopping(self) -> bool: ...

    def attach(self, slot: Slot, fd: int) -> None:
        """Serve ``slot``'s control channel on the socket ``fd``."""

    def pause_accepting(self) -> None: ...

    def resume_accepting(self) -> None: ...

    async def settle(self) -> None:
        """Until everything under way is done and sent."""

    def inherited_state(self) -> Inherited:
        """What the next image takes over; the control channels are let go of (not closed)."""

    def status(self) -> str:
        """The ``STATUS=`` line for systemd."""


class Upgrader(Operation):
    """Runs SIGUSR2 for one supervisor."""

    name = "upgrade"

    def __init__(self, sup: Upgraded, reloader: Reloader) -> None:
        super().__init__()
        self.sup = sup
        self.reloader = reloader  # an upgrade waits for the reload under way
        self.hurry = asyncio.Event()  # greetings: hand off now with what was read
        self.upgrades = 0  # images that took over from a previous one, this one included

    def request(self) -> None:
        """SIGUSR2 (one while one runs is ignored)."""
        if not self.begin(self._run):
            log.info("upgrade requested while one runs: ignored")

    async def resume_shards(self, inherited: Inherited) -> None:
        """The new image: each inherited shard goes on (it sends what it held and its topics)."""
        for slot, shard in zip(self.sup.slots, inherited.shards):
            self.sup.attach(slot, shard.control_fd)
            slot.started = time.monotonic()
        await asyncio.gather(*(self._resume(slot) for slot in self.sup.slots))

    async def _resume(self, slot: Slot) -> None:
        if slot.channel is None or slot.channel.closed:
            return
        try:
            await slot.channel.call(Resume(), wait=QUIESCE_WAIT)
        except (ConnectionError, TimeoutError) as exc:  # it died meanwhile: reaped and restarted
            log.error("shard %d: did not resume - %s", slot.index, exc or "timed out")
            return
        slot.ready.set()

    async def _run(self) -> None:
        sup = self.sup
        reloading = self.reloader.task
        if reloading is not None:
            log.info("upgrade: waiting for the reload under way")
            await asyncio.wait([reloading])
        log.info("upgrading: checking the installed code")
        why = await preflight(sup.argv)
        if why is None and reread(sup.argv, sup.opts) is None:
            why = "the options cannot be used (logged above)"
        if why is None and not all(s.is_ready for s in sup.slots):
            why = "a shard is not serving"
        if why is not None:
            log.error("upgrade refused: %s; the node runs on unchanged", why)
            return
        if sup.stopping:
            return
        log.info("upgrading: quiescing, then re-executing the supervisor (pid %d)", os.getpid())
        sdnotify.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}",
                        "STATUS=upgrading: re-executing the supervisor")
        try:
            await asyncio.wait_for(self.quiesce(), QUIESCE_WAIT)
        except (TimeoutError, ConnectionError) as exc:
            log.error("upgrade abandoned: %s; the node runs on unchanged", exc or "timed out")
            await self.resume()
            return
        state = sup.inherited_state()
        try:
            reexec(sup.argv, state)
        except OSError as exc:
            log.error("upgrade abandoned: cannot re-execute - %s; the node runs on unchanged", exc)
            for slot, shard in zip(sup.slots, state.shards):
                sup.attach(slot, shard.control_fd)
            await self.resume()

    def stop(self) -> None:
        """The node stops: an upgrade not yet at its ``execve`` is abandoned."""
        self.cancel()

    async def quiesce(self) -> None:
        """Steps 2-4 of the module doc. Raises ``TimeoutError``/``ConnectionError``."""
        sup = self.sup
        sup.pause_accepting()
        self.hurry.set()
        replies = await asyncio.gather(*(s.channel.call(Hold(), wait=QUIESCE_WAIT) for s in sup.slots
                                         if s.channel is not None))
        if not all(isinstance(r, Done) for r in replies) or len(replies) != len(sup.slots):
            raise ConnectionError("a shard did not hold")
        await sup.settle()

    async def resume(self) -> None:
        """The upgrade did not happen: carry on as before."""
        self.hurry.clear()
        await asyncio.gather(*(self._resume(slot) for slot in self.sup.slots))
        self.sup.resume_accepting()
        sdnotify.notify("READY=1", self.sup.status())


async def preflight(argv: list[str]) -> str | None:
    """Start the installed code's supervisor (parsing ``argv``) and shard worker as far as
    their imports, each in a child process; why it failed, or None."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, WORKER_ENV)}
    env[IMPORT_CHECK] = "1"
    checks = [("pynsqd.supervisor", same_code_command(CLI, argv)), ("pynsqd.shard.worker", worker_command())]
    for name, (command, extra) in checks:
        try:
            proc = await asyncio.create_subprocess_exec(*command, env={**env, **extra},
                                                        stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), PREFLIGHT_WAIT)
        except (OSError, TimeoutError) as exc:
            return f"{name} cannot start - {exc}"
        if proc.returncode != 0:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            return f"{name} fails to start - {lines[-1] if lines else f'exit status {proc.returncode}'}"
    return None


def reexec(argv: list[str], state: Inherited) -> None:
    """``execve`` the installed supervisor with ``state`` (returns only on failure: ``OSError``,
    with the descriptors made close-on-exec again)."""
    command, extra = same_code_command(CLI, argv)  # as the shards are started: this sys.path, not the cwd's
    env = {**os.environ, **extra, ENV: state.encode()}
    for fd in state.fds:
        os.set_inheritable(fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    # A signal that comes before the new image handles it waits, blocked (the mask and what
    # is pending survive execve): a SIGTERM then stops the node cleanly instead of killing it.
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        os.execve(command[0], command, env)
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        for fd in state.fds:
            os.set_inheritable(fd, False)
        raise
