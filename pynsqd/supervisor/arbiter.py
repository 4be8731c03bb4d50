"""The supervisor: one nsqd node as a tree of shard processes (gunicorn's arbiter, for nsqd).

Theory of operation
-------------------
``Supervisor(opts, shards)`` does what must happen once per node, in the constructor so that
port 0 works and errors are one line: check the TLS files, bind TCP and HTTP, lock the data
path and check that it is writable, read ``nsqd.dat``, load the placement table
(``node/placement.py``) and place every known topic, store on disk what leftover inbound rings
of a run with another shard count hold (``leftover_rings.py``), create the inbound rings
(``node/rings.py``), one heartbeat page and one eventfd per shard. A step that fails undoes
the ones before it (``startup.py``): a failed start leaves nothing behind.

``main()`` starts the shards — at a fresh node's boot forked by the zygote that imported
their code meanwhile (``node/zygote.py``), later spawned (``os.posix_spawn`` of
``node/boot.worker_command``: a fresh interpreter that imports exactly this process's code);
never a fork of a running loop — with their descriptors, accepts once the first says
``ready`` and announces the listeners once all have, accepts TCP connections and hands each
to its shard (``handoff.py``), accepts HTTP and HTTPS connections and hands them to the shards in
turn (``httpaccept.py``) — every listener through one ``accept.Acceptor``, which rides out a
lack of descriptors — and keeps the node's single lookupd registration and ``nsqd.dat``
from what the shards report (``topictable.py``). What a shard asks of the others (stats,
health, admin calls for their topics) the supervisor relays (``hub.py``).

A new image of a running supervisor (``upgrade.py``, SIGUSR2) is constructed from what it
inherits instead (``_take_over``: listeners, lock, shards, rings as they are), and replaces the
shards once it accepts (``reload.py``).

Signal handlers only enqueue (SIGTERM, SIGINT; SIGHUP: a rolling restart of the shards,
``reload.py``; SIGUSR2: an upgrade of the supervisor); the loop drains the queue.
uvloop reserves SIGCHLD, so instead every ``TICK`` the loop reaps (``handle_chld``) and
checks heartbeats (``tend_shards``): a shard
whose loop has not written its timestamp for ``SHARD_TIMEOUT`` gets SIGABRT, and SIGKILL
``KILL_AFTER`` later. ``handle_chld`` reaps with ``waitpid(-1, WNOHANG)`` until 0 and
classifies: ``BOOT_ERROR`` (the shard could not start) stops the node with the shard's
one-line error and exit status 1; anything else is restarted after a back-off that doubles
with each death that came soon after a start (0.1 s … 10 s), and SIGKILL is logged as a
possible OOM kill.

``exit`` is the node's clean shutdown under ``SHUTDOWN_DEADLINE``: stop accepting, ``quiesce``
then ``exit`` every shard, SIGKILL stragglers, save ``nsqd.dat``, close the registration, keep
only non-empty rings, unlock. docs/architecture.md ("Clean shutdown") describes it whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from pynsqd import NSQ_VERSION, __version__, logs, sdnotify
from pynsqd.netaddr import bind, bound_port, describe
from pynsqd.node import metadata
from pynsqd.node.boot import BOOT_ERROR, ENV, BootConfig, worker_command
from pynsqd.node.config import NsqdOptions
from pynsqd.node.control import ControlChannel, Received, channel_pair
from pynsqd.node.heartbeat import STALL_AFTER, Heartbeat
from pynsqd.node.messages import (
    Adopt,
    Changed,
    ConnectionState,
    ControlMessage,
    CreateChannels,
    Exit,
    Failed,
    HandOff,
    Handover,
    HealthRequest,
    Proxy,
    Quiesce,
    Ready,
    ServeHTTP,
    SetConfig,
    Snapshot,
    StatsRequest,
    Updated,
)
from pynsqd.node.metadata import TopicRecord
from pynsqd.node.placement import Placement
from pynsqd.node.rings import create_rings, release_rings
from pynsqd.node.shmowner import OwnerRecord
from pynsqd.node.tls import build_server_context
from pynsqd.node.zygote import Zygote
from pynsqd.options import UsageError
from pynsqd.shm.sizing import Host, plan
from pynsqd.signals import signals_to
from pynsqd.supervisor import leftover_rings
from pynsqd.supervisor.accept import Accepted, Acceptor
from pynsqd.supervisor.handoff import greet
from pynsqd.supervisor.httpaccept import ACK_WAIT, HTTPAcceptor
from pynsqd.supervisor.hub import READY_TIMEOUT, Hub
from pynsqd.supervisor.registration import Registration
from pynsqd.supervisor.reload import Reloader
from pynsqd.supervisor.slots import Slot
from pynsqd.supervisor.startup import Startup, sweep_segments
from pynsqd.supervisor.statsd import StatsdLines, StatsdPusher, statsd_prefix
from pynsqd.supervisor.topictable import MetadataWriter, TopicTable
from pynsqd.supervisor.upgrade import SIGNALS, Inherited, InheritedShard, Upgrader
from pynsqd.wire.lookup import IdentifyInfo
from pynsqd.wire.names import is_ephemeral, is_valid_name

log = logging.getLogger("pynsqd.supervisor")

SHARD_TIMEOUT = float(os.environ.get("PYNSQD_SHARD_TIMEOUT", "10"))  # seconds without a beat
KILL_AFTER = 2.0
SHUTDOWN_DEADLINE = float(os.environ.get("PYNSQD_SHUTDOWN_DEADLINE", "20"))
TICK = 0.2  # seconds between reaping/heartbeat checks
FIN_WAIT = 5.0  # seconds a shutting-down shard waits for consumers to FIN what they hold
HANDOFF_TRIES = 5  # shards that may die (or lose its descriptor) under one connection before it is given up
ADOPT_RETRY = 0.05  # seconds before the next try after a shard lost a connection's descriptor, times the tries


class Supervisor:
    """One nsqd node: N shard processes behind one set of listeners."""

    def __init__(self, opts: NsqdOptions, shards: int, inherited: Inherited | None = None,
                 zygote: Zygote | None = None) -> None:
        self.opts = opts
        self.shards = shards
        self.inherited = inherited  # this image replaced a running supervisor (``upgrade.py``)
        self.zygote = zygote  # forks the first boot's shards (``node/zygote.py``)
        self.host = Host.now()
        if inherited is None:
            topics = self._start()
        else:
            topics = self._take_over(inherited)
        self.topics = TopicTable(shards)
        for topic in topics:
            self.topics.update(self.placement.owner(topic.name), [topic], [])
        self.metadata = MetadataWriter(opts.data_dir, self.topics.encode)
        self.tcp_acceptor = Acceptor("TCP", self.tcp_socket, self._greet)
        self.http_acceptor = HTTPAcceptor(self.slots)
        self.registration = Registration(self.identity, self.topics.registrations, opts.max_body_size)
        self.hub = Hub(self.slots, self.stats, self.start_time)
        self.handoffs = 0
        self.fatal: str | None = None
        self._signals: asyncio.Queue[int] = asyncio.Queue()  # signal numbers, from the handlers
        self._stopping = False
        self._exited = False
        self._next_any = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._accept_task: asyncio.Task[None] | None = None
        self._statsd_task: asyncio.Task[None] | None = None
        self._handlers: dict[type[ControlMessage], Callable[[Slot, Any, Received], None]] = {
            Ready: self._on_ready, Snapshot: self._on_snapshot, Updated: self._on_updated, Changed: self._on_changed,
            HandOff: self._on_handoff, StatsRequest: self._on_stats, HealthRequest: self._on_health,
            Proxy: self._on_proxy, SetConfig: self._on_config, Handover: self._on_handover,
            ServeHTTP: self._on_serve_http,
        }
        self.argv: list[str] = sys.argv[1:]  # the command line, read again by a reload
        self.reloader = Reloader(self)
        self.upgrader = Upgrader(self, self.reloader)
        if inherited is not None:
            counters = inherited.counters
            self.handoffs, self.http_acceptor.handed = counters["handoffs"], counters["http_handoffs"]
            self.reloader.reloads, self.reloader.replaced = counters["reloads"], counters["shards_replaced"]
            self.upgrader.upgrades = counters["upgrades"] + 1

    def _start(self) -> list[TopicRecord]:
        """What needs no file first (TLS files, addresses, ports), then the data path: a start
        that fails says one line and leaves nothing behind (``Startup``). The topics of
        ``nsqd.dat``."""
        opts, shards = self.opts, self.shards
        try:
            tls_ctx = build_server_context(opts)  # each shard builds its own from the same files
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"failed to load TLS certificate/key: {exc}") from None
        with Startup(opts.data_dir) as start:
            self.tcp_socket = start.close_on_failure(bind(opts.tcp_address, "tcp-address"))
            self.http_socket = (start.close_on_failure(bind(opts.http_address, "http-address"))
                                if opts.http_address else None)
            self.https_socket = (start.close_on_failure(bind(opts.https_address, "https-address"))
                                 if opts.https_address and tls_ctx is not None else None)
            self._lock_fd = start.lock()
            self.owner = start.own_shared_memory(self._lock_fd)
            try:
                topics = metadata.load(opts.data_dir)
            except ValueError as exc:
                raise UsageError(f"failed to load metadata - {exc}") from None
            self.placement = start.placement(shards)
            self.placement.rebalance_at_start()
            keep = leftover_rings.rescue(opts, shards, self.placement.owner, topics)  # before any shard
            self.rings = create_rings(opts.data_dir, shards)
            start.on_failure(lambda: release_rings(self.rings))
        sweep_segments(opts.data_dir, topics, {seg.name for seg in self.rings} | keep | {self.owner.name},
                       self.placement.owner)
        self.wake_fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(shards)]
        self.slots = [Slot(i) for i in range(shards)]
        self.start_ns = time.time_ns()
        self.start_time = self.start_ns // 1_000_000_000
        self.log_sizing = plan(opts.mem_queue_bytes, opts.max_msg_size, self.host)  # every shard's
        return topics

    def _take_over(self, inherited: Inherited) -> list[TopicRecord]:
        """A new image of a running supervisor (``upgrade.py``): its listeners, lock, rings,
        shards and start time as the previous image left them. The topics of ``nsqd.dat``."""
        if len(inherited.shards) != self.shards:
            raise UsageError(f"cannot take over {len(inherited.shards)} shard(s) with --shards={self.shards}")
        self.tcp_socket = socket.socket(fileno=inherited.tcp_fd)
        self.http_socket = inherited.socket(inherited.http_fd)
        self.https_socket = inherited.socket(inherited.https_fd)
        self._lock_fd = inherited.lock_fd
        self.owner = OwnerRecord(self.opts.data_dir, inherited.owner_fd)  # still locked: the fd survived
        topics = metadata.load(self.opts.data_dir)
        self.placement = Placement(self.opts.data_dir, self.shards)
        self.rings = create_rings(self.opts.data_dir, self.shards)  # they exist: opened as they are
        self.wake_fds = list(inherited.wake_fds)
        self.slots = [Slot(s.index, Heartbeat(s.heartbeat_fd)) for s in inherited.shards]
        for slot, shard in zip(self.slots, inherited.shards):
            slot.pid, slot.restarts, slot.version = shard.pid, shard.restarts, shard.version
        self.start_ns, self.start_time = inherited.start_ns, inherited.start_time
        self.log_sizing = inherited.log_sizing
        return topics

    # --- identity, registration, metadata ---------------------------------------------------
    @property
    def tcp_port(self) -> int:
        return bound_port(self.tcp_socket)

    @property
    def http_port(self) -> int:
        return bound_port(self.http_socket) if self.http_socket else -1

    @property
    def https_port(self) -> int:
        return bound_port(self.https_socket) if self.https_socket else -1

    def identity(self) -> IdentifyInfo:
        return IdentifyInfo(broadcast_address=self.opts.broadcast_address,
                            tcp_port=self.opts.broadcast_tcp_port or self.tcp_port,
                            http_port=self.opts.broadcast_http_port or self.http_port,
                            version=NSQ_VERSION, hostname=socket.gethostname())

    # --- spawning and supervising shards -----------------------------------------------------
    def spawn(self, slot: Slot, zygote: Zygote | None = None) -> None:
        """Start the shard of ``slot`` (forked by ``zygote`` if it can). Raises ``OSError``
        (descriptors or processes exhausted) with nothing left open."""
        slot.reset_heartbeat()
        slot.pid, slot.channel = self.launch(slot.index, zygote=zygote)
        slot.started = time.monotonic()
        how = "forked by the zygote" if zygote is not None and zygote.pid else "spawned"
        log.info("shard %d: started (pid %d, %s)", slot.index, slot.pid, how)

    def launch(self, index: int, standby: bool = False, zygote: Zygote | None = None) -> tuple[int, ControlChannel]:
        """A worker process for shard ``index`` (``standby``: to replace the running one,
        ``reload.py``), forked by ``zygote`` if it answers and spawned otherwise, and its
        control channel. Raises ``OSError`` with nothing left open."""
        here, there = channel_pair()
        boot = BootConfig(index=index, shards=self.shards, parent=os.getpid(), opts=self.opts,
                          log_sizing=self.log_sizing, start_time=self.start_time, start_ns=self.start_ns,
                          tcp_port=self.tcp_port, http_port=self.http_port, https_port=self.https_port,
                          http=self.http_socket is not None, https=self.https_socket is not None,
                          control_fd=there.fileno(), heartbeat_fd=self.slots[index].heartbeat.fd,
                          wake_fds=self.wake_fds, standby=standby)
        try:
            pid = zygote.fork(boot.encode(), boot.inherited) if zygote is not None else None
            if pid is None:
                pid = _spawn_worker(boot)
        except OSError:
            here.close()
            raise
        finally:
            there.close()
        channel = ControlChannel(here, self._on_control, f"shard {index}")
        channel.on_close = self._channel_closed
        channel.start(asyncio.get_running_loop())
        return pid, channel

    def _channel_closed(self, channel: ControlChannel) -> None:
        """A shard's process is gone (reaped soon): nothing more is handed to it."""
        for slot in self.slots:
            if slot.channel is channel:
                slot.ready.clear()

    def handle_chld(self) -> None:
        """Reap every dead shard; classify its exit; schedule its restart."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is None:
                self.reloader.reaped(pid, code)  # a replacement, or a replaced shard's process
                continue
            slot.died()
            if slot.successor is not None:  # it died while being replaced: a crash after all
                self.reloader.abandon(slot)
            if self._stopping:
                continue
            if code == BOOT_ERROR:
                self.fatal = f"shard {slot.index} failed to boot"
                log.error("%s (exit status %d); not restarting", self.fatal, code)
                self._signals.put_nowait(signal.SIGTERM)
                continue
            if code == -signal.SIGKILL:
                log.error("shard %d (pid %d) was killed (SIGKILL; possibly out of memory)", slot.index, pid)
            else:
                log.error("shard %d (pid %d) exited with status %d", slot.index, pid, code)
            delay = slot.schedule_restart(time.monotonic())
            log.info("shard %d: restarting in %.1fs", slot.index, delay)

    def tend_shards(self, now: float) -> None:
        """Kill shards whose loop stopped beating; respawn dead ones whose restart is due."""
        for slot in self.slots:
            quiet = now - slot.last_beat()  # read once: every decision below and its log agree
            if slot.pid and slot.is_ready:
                self._check_stall(slot, quiet)
            if slot.pid and slot.is_ready and quiet > SHARD_TIMEOUT:
                if slot.abort_sent is None:
                    log.error("shard %d (pid %d): no heartbeat for %.1fs - SIGABRT", slot.index, slot.pid, quiet)
                    slot.abort_sent = now
                    _kill(slot.pid, signal.SIGABRT)
                elif now - slot.abort_sent > KILL_AFTER:
                    log.error("shard %d (pid %d): still stuck - SIGKILL", slot.index, slot.pid)
                    _kill(slot.pid, signal.SIGKILL)
            elif slot.pid == 0 and slot.respawn_at is not None and now >= slot.respawn_at and not self._stopping:
                slot.respawn_at = None
                self._respawn(slot, now)

    def _respawn(self, slot: Slot, now: float) -> None:
        """Restart a dead shard; one that cannot be started now (EMFILE, EAGAIN) is tried
        again with the restart back-off, logged once per failing spell."""
        try:
            self.spawn(slot)
        except OSError as exc:
            delay = slot.schedule_restart(now)
            if not slot.spawn_failing:
                log.error("shard %d: cannot start - %s; retrying with back-off", slot.index, exc)
            else:
                log.debug("shard %d: cannot start - %s; retrying in %.1fs", slot.index, exc, delay)
            slot.spawn_failing = True
            return
        slot.restarts += 1
        if slot.spawn_failing:
            log.info("shard %d: started again after failed attempts", slot.index)
            slot.spawn_failing = False

    @staticmethod
    def _check_stall(slot: Slot, quiet: float) -> None:
        """A shard silent for ``STALL_AFTER`` gets no new HTTP connections until it beats
        again (``httpaccept.py``); one silent for ``SHARD_TIMEOUT`` is killed (``tend_shards``)."""
        if quiet > STALL_AFTER and not slot.stalled:
            slot.stalled = True
            log.warning("shard %d (pid %d): loop silent for %.1fs - new HTTP connections go to the other shards",
                        slot.index, slot.pid, quiet)
        elif quiet <= STALL_AFTER and slot.stalled:
            slot.stalled = False
            log.info("shard %d (pid %d): beating again", slot.index, slot.pid)

    # --- control messages from shards ---------------------------------------------------------
    def _on_control(self, chan: ControlChannel, received: Received) -> None:
        slot = next((s for s in self.slots if s.channel is chan), None)
        if slot is None:  # a replacement, not yet serving its slot
            slot = next((s for s in self.slots if s.successor is not None and s.successor.channel is chan), None)
            if slot is None or self.reloader.from_successor(slot, received.message):
                return
        handler = self._handlers.get(type(received.message))
        if handler is None:
            log.error("shard %d: unexpected control message %s", slot.index, received.message.op)
            return
        handler(slot, received.message, received)

    def _on_ready(self, slot: Slot, msg: Ready, received: Received) -> None:
        slot.version = msg.version
        slot.ready.set()
        log.info("shard %d: ready", slot.index)
        self.http_acceptor.flush()

    def _on_handover(self, slot: Slot, msg: Handover, received: Received) -> None:
        self.reloader.relay(slot, msg, received.take_fds())

    def _on_serve_http(self, slot: Slot, msg: ServeHTTP, received: Received) -> None:
        """Idle HTTP connections a shard being replaced gives back: another shard serves them."""
        self.http_acceptor.give([socket.socket(fileno=fd) for fd in received.take_fds()], msg.tls)

    def _on_snapshot(self, slot: Slot, msg: Snapshot, received: Received) -> None:
        self.topics.replace(slot.index, msg.topics)
        self.metadata.schedule()

    def _on_updated(self, slot: Slot, msg: Updated, received: Received) -> None:
        self.topics.update(slot.index, msg.topics, msg.deleted)
        self.metadata.schedule()

    def _on_changed(self, slot: Slot, msg: Changed, received: Received) -> None:
        self._changed(msg.event, msg.topic, msg.channel)

    def _on_handoff(self, slot: Slot, msg: HandOff, received: Received) -> None:
        fds = received.take_fds()
        if fds:
            for extra in fds[1:]:
                os.close(extra)
            self._spawn_task(self._handoff(msg.shard, socket.socket(fileno=fds[0]), msg.state, msg.unread))

    def _on_stats(self, slot: Slot, msg: StatsRequest, received: Received) -> None:
        self._spawn_task(self.hub.stats(slot, msg, received))

    def _on_health(self, slot: Slot, msg: HealthRequest, received: Received) -> None:
        self._spawn_task(self.hub.health(slot, received))

    def _on_proxy(self, slot: Slot, msg: Proxy, received: Received) -> None:
        self._spawn_task(self.hub.proxy(slot, msg, received))

    def _on_config(self, slot: Slot, msg: SetConfig, received: Received) -> None:
        """``PUT /config/<opt>`` succeeded on one shard: apply it node-wide."""
        if msg.opt == "nsqlookupd_tcp_addresses":
            self.opts.lookupd_tcp_address = list(orjson.loads(msg.value))
            self.registration.set_addresses(self.opts.lookupd_tcp_address)
        elif msg.opt == "log_level":
            level = msg.value.decode("utf-8", "replace").strip().lower()
            self.opts.log_level = level
            logs.set_level(level)
        for other in self.slots:
            if other is not slot:
                self._spawn_task(self.hub.send_to(other, msg))

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed - %r", task.exception())

    def _changed(self, event: str, topic: str, channel: str | None) -> None:
        self.registration.changed(event, topic, channel)
        if event == "created" and channel is None and self.registration.peers:
            self._spawn_task(self._precreate_channels(topic))

    async def _precreate_channels(self, topic: str) -> None:
        names = sorted(n for n in await self.registration.channels_for(topic)
                       if not is_ephemeral(n) and is_valid_name(n))
        if names:
            await self.hub.send_to(self.slots[self.placement.owner(topic)], CreateChannels(topic, names))

    @property
    def stopping(self) -> bool:
        return self._stopping

    def apply_options(self, new: NsqdOptions, names: list[str]) -> None:
        """A reload's options (``reload.py``): the supervisor's own settings change now, the
        shards' with each replacement (they boot with ``self.opts``)."""
        for name in names:
            setattr(self.opts, name, getattr(new, name))
        if "log_level" in names:
            logs.set_level(self.opts.log_level)
        if "lookupd_tcp_address" in names:
            self.registration.set_addresses(self.opts.lookupd_tcp_address)
        if any(name.startswith("statsd_") for name in names) and self._accept_task is not None \
                and self._accept_task.done():
            self._start_statsd()

    def _start_statsd(self) -> None:
        if self._statsd_task is not None:
            self._statsd_task.cancel()
            self._statsd_task = None
        if self.opts.statsd_address:
            self._statsd_task = asyncio.get_running_loop().create_task(self._statsd().run())
            self._tasks.add(self._statsd_task)
            self._statsd_task.add_done_callback(self._task_done)

    async def _ready_slot(self, index: int | None) -> Slot | None:
        if index is None:
            index = self._next_any % self.shards
            self._next_any += 1
        slot = self.slots[index]
        try:
            await asyncio.wait_for(slot.ready.wait(), READY_TIMEOUT)
        except TimeoutError:
            return None
        return slot

    async def _handoff(self, index: int | None, sock: socket.socket, state: ConnectionState,
                       unread: bytes) -> None:
        """Give a TCP connection to shard ``index`` (None: any), once it is ready. ``Adopt``
        is a call: the shard answers before it reads a byte, and until then the connection is
        ours; a shard that dies first leaves it unread, for the process that replaces it."""
        try:
            for tries in range(HANDOFF_TRIES):
                slot = await self._ready_slot(index)
                channel = slot.channel if slot is not None else None
                if self._stopping or channel is None or channel.closed:
                    return
                try:
                    answer = await channel.call(Adopt(state, unread), [sock.fileno()], wait=ACK_WAIT)
                except ConnectionError:
                    continue  # died first: its replacement (or another shard) gets it, unread
                except TimeoutError:
                    pass  # alive but silent for that long: it may have it
                else:
                    if isinstance(answer, Failed):  # the descriptor did not reach it: again, after a pause
                        await asyncio.sleep(ADOPT_RETRY * (tries + 1))
                        continue
                self.handoffs += 1
                return
        finally:
            sock.close()

    def _statsd(self) -> StatsdPusher:
        """One pusher per node, here: it sends the figures aggregated over every shard."""
        opts = self.opts
        prefix = statsd_prefix(opts.statsd_prefix, opts.broadcast_address, opts.broadcast_http_port or self.http_port)
        lines = StatsdLines(prefix, opts.statsd_mem_stats, opts.statsd_exclude_ephemeral)
        return StatsdPusher(opts.statsd_address, opts.statsd_interval, opts.statsd_udp_packet_size, lines,
                            lambda: self.hub.node_stats(StatsRequest(include_clients=False)))

    def stats(self) -> dict[str, Any]:
        return {"shards": self.shards, "handoffs": self.handoffs, "http_handoffs": self.http_acceptor.handed,
                "shard_restarts": sum(s.restarts for s in self.slots), "reloads": self.reloader.reloads,
                "shards_replaced": self.reloader.replaced, "upgrades": self.upgrader.upgrades,
                "version": __version__,
                "shard_status": [{"shard": s.index, "pid": s.pid, "ready": s.is_ready,
                                  "restarts": s.restarts, "version": s.version} for s in self.slots]}

    # --- main loop ------------------------------------------------------------------------------
    async def main(self) -> int:
        """Run the node until it stops; its exit status. Signal handlers only enqueue."""
        with signals_to(self._signals.put_nowait, SIGNALS):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # blocked across an upgrade's execve
            return await self._run()

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        log.info("pynsqd %s (nsqd v%s compatible), %d shard(s)", __version__, NSQ_VERSION, self.shards)
        log.info("ID: %d", self.opts.node_id)
        log.info("%s", self.log_sizing.describe(self.opts.mem_queue_size, self.host))
        self.metadata.save_now()
        if self.inherited is not None:
            self._spawn_task(self.upgrader.resume_shards(self.inherited))
        else:
            self._start_shards()
        self._accept_task = loop.create_task(self._wait_then_accept())
        self._accept_task.add_done_callback(self._task_done)
        while not self._stopping:
            try:
                sig = int(await asyncio.wait_for(self._signals.get(), TICK))
            except TimeoutError:
                self.handle_chld()
                self.tend_shards(time.monotonic())
                continue
            if sig == signal.SIGHUP:
                self.reloader.request()
                continue
            if sig == signal.SIGUSR2:
                self.upgrader.request()
                continue
            log.info("received signal %d, shutting down", sig)
            await self.exit()
        if self.fatal:
            print(f"nsqd: {self.fatal}", file=sys.stderr)
            return 1
        return 0

    def _start_shards(self) -> None:
        """The first boot: the zygote forks the shards (each spawned if it cannot), then
        ends, so that every later shard runs the code installed then. A shard that cannot be
        started stops the node."""
        zygote, self.zygote = self.zygote, None
        if zygote is not None and not zygote.ready():
            log.warning("the zygote did not start: spawning the shards")
        for slot in self.slots:
            try:
                self.spawn(slot, zygote)
            except OSError as exc:
                self.fatal = f"cannot start shard {slot.index} - {exc}"
                self._signals.put_nowait(signal.SIGTERM)
                break
        if zygote is not None:
            zygote.close()

    async def _wait_then_accept(self) -> None:
        """Accept from the first shard that is ready on: connections for a shard still
        booting wait for it (``_ready_slot``), as do ``/stats`` and ``/ping``
        (``_call_each``). The listeners are announced (the log, lookupd, systemd's
        ``READY=1``) once every shard is ready: a shard that fails to boot stops a node that
        never said it was up."""
        waits = [asyncio.ensure_future(slot.ready.wait()) for slot in self.slots]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            loop = asyncio.get_running_loop()
            for listener, tls in ((self.http_socket, False), (self.https_socket, True)):
                if listener is not None:
                    self.http_acceptor.start(loop, listener, tls)
            self.tcp_acceptor.start(loop)
            await asyncio.wait(waits)
        finally:
            for wait in waits:
                wait.cancel()
        log.info("TCP: listening on %s", describe(self.tcp_socket))
        if self.http_socket is not None:
            log.info("HTTP: listening on %s", describe(self.http_socket))
        if self.https_socket is not None:
            log.info("HTTPS: listening on %s", describe(self.https_socket))
        self._start_statsd()
        self.registration.set_addresses(self.opts.lookupd_tcp_address)
        sdnotify.notify("READY=1", self.status())
        if self.inherited is not None:  # the shards still run the previous code: replace them
            log.info("upgraded: this supervisor (pid %d) runs the installed code; replacing the shards", os.getpid())
            self.reloader.request()

    # --- an upgrade of this supervisor (``upgrade.py``) -------------------------------------------
    def attach(self, slot: Slot, fd: int) -> None:
        """Serve ``slot``'s control channel on an inherited (or re-attached) socket."""
        slot.channel = ControlChannel(socket.socket(fileno=fd), self._on_control, f"shard {slot.index}")
        slot.channel.on_close = self._channel_closed
        slot.channel.start(asyncio.get_running_loop())

    @property
    def lock_fd(self) -> int:
        return self._lock_fd

    def pause_accepting(self) -> None:
        """New connections wait in the kernel's backlog (none is refused)."""
        self.tcp_acceptor.stop()
        self.http_acceptor.pause()

    def resume_accepting(self) -> None:
        """An upgrade that did not happen: accepting, lookupd and statsd again."""
        loop = asyncio.get_running_loop()
        self.http_acceptor.resume(loop)
        self.tcp_acceptor.start(loop)
        self._start_statsd()
        self.registration.set_addresses(self.opts.lookupd_tcp_address)

    async def settle(self) -> None:
        """Before an ``execve``: until everything under way is done (greetings, hand-offs,
        calls), every control message sent, the metadata written, lookupd and statsd closed."""
        if self._statsd_task is not None:
            self._statsd_task.cancel()
            self._statsd_task = None
        while self._tasks or self.http_acceptor.unacknowledged:
            await asyncio.wait([*self._tasks, *self.http_acceptor.tasks])
        await self.metadata.flush()
        await self.registration.close()
        for slot in self.slots:
            if slot.channel is not None:
                await slot.channel.sent()

    def inherited_state(self) -> Inherited:
        """What the next image takes over (``upgrade.py``); the control channels are let go of
        (not closed)."""
        shards = [InheritedShard(s.index, s.pid, s.channel.detach() if s.channel is not None else -1,
                                 s.heartbeat.fd, s.restarts, s.version) for s in self.slots]
        return Inherited(tcp_fd=self.tcp_socket.fileno(),
                         http_fd=self.http_socket.fileno() if self.http_socket else -1,
                         https_fd=self.https_socket.fileno() if self.https_socket else -1, lock_fd=self.lock_fd,
                         owner_fd=self.owner.fd, wake_fds=self.wake_fds, shards=shards, start_time=self.start_time,
                         start_ns=self.start_ns, log_sizing=self.log_sizing, counters=self.counters())

    def counters(self) -> dict[str, int]:
        return {"handoffs": self.handoffs, "http_handoffs": self.http_acceptor.handed,
                "reloads": self.reloader.reloads, "shards_replaced": self.reloader.replaced,
                "upgrades": self.upgrader.upgrades}

    def status(self) -> str:
        """The ``STATUS=`` line for systemd."""
        return f"STATUS=serving TCP on {describe(self.tcp_socket)}, {self.shards} shard(s)"

    def _greet(self, accepted: Accepted) -> None:
        """TCP connections: each is read up to its first routing command, then handed to the
        shard that should serve it (``handoff.py``)."""
        for conn, addr in accepted:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn_task(greet(conn, addr, self.opts, self.placement.owner, self._handoff, self.upgrader.hurry))

    async def exit(self) -> None:
        if self._exited:
            return
        self._exited = True
        self._stopping = True
        sdnotify.notify("STOPPING=1")
        started = time.monotonic()
        deadline = started + SHUTDOWN_DEADLINE
        if self._accept_task is not None:
            self._accept_task.cancel()
        self.reloader.stop()
        self.upgrader.stop()
        self.tcp_acceptor.stop()
        self.http_acceptor.stop()
        for task in list(self._tasks):
            task.cancel()
        for listener in (self.tcp_socket, self.http_socket, self.https_socket):
            if listener is not None:
                listener.close()
        live = [s for s in self.slots if s.pid and s.channel is not None and not s.channel.closed]
        fin_wait = min(FIN_WAIT, SHUTDOWN_DEADLINE / 4)
        quiesce = [s.channel.call(Quiesce(fin_wait), wait=max(0.1, deadline - time.monotonic()))
                   for s in live if s.channel is not None]
        await asyncio.gather(*quiesce, return_exceptions=True)
        for slot in live:
            if slot.channel is not None and not slot.channel.closed:
                slot.channel.send(Exit())
        killed = await self._wait_children(deadline)
        if killed:
            log.error("%d shard(s) did not exit in time and were killed", killed)
        await self.metadata.flush()  # the last save: its failure is always logged
        await self.registration.close()
        release_rings(self.rings)
        self.placement.close()
        self.owner.release()
        os.close(self._lock_fd)
        log.info("exited cleanly in %.3fs", time.monotonic() - started)

    async def _wait_children(self, deadline: float) -> int:
        """Reap shards until all are gone or the deadline passes; then SIGKILL the rest."""
        while any(s.pid for s in self.slots) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            while not self._signals.empty():
                self._signals.get_nowait()
            self.handle_chld()
        stragglers = [s for s in self.slots if s.pid]
        for slot in stragglers:
            _kill(slot.pid, signal.SIGKILL)
        for slot in stragglers:
            for _ in range(250):  # SIGKILL cannot be refused: this takes milliseconds
                if _reaped(slot.pid):
                    break
                await asyncio.sleep(0.02)
            slot.died()
        return len(stragglers)


def _reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _spawn_worker(boot: BootConfig) -> int:
    """A fresh interpreter of this process's code running a shard with ``boot``."""
    fds = boot.inherited
    argv, extra = worker_command()
    env = {**os.environ, **extra, ENV: boot.encode()}
    for fd in fds:
        os.set_inheritable(fd, True)
    try:
        return os.posix_spawn(argv[0], argv, env)
    finally:
        for fd in fds:
            os.set_inheritable(fd, False)
