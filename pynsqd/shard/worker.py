"""A shard worker process, started by the supervisor (``node/boot.worker_command``, or at a
node's first boot forked by the zygote, ``node/zygote.py``: ``forked``).

Theory of operation
-------------------
The supervisor starts each worker (a fresh interpreter, or a fork of the zygote that
imported this module meanwhile; never a fork of a running loop) with
everything it needs in a ``BootConfig`` (``node/boot.py``): inherited file descriptors (its
end of the control socketpair, the heartbeat page and one eventfd per shard, wake-ups for the
inbound rings) and the resolved options. It has no listening socket: the supervisor accepts
every connection. The control messages both ways are the typed ones of ``node/messages.py``,
dispatched by type through ``_handlers``.

Boot: die with the parent (``PR_SET_PDEATHSIG``), build the ``Broker`` with this shard's
index (message ids carry it), restore the topics of ``nsqd.dat`` this shard owns — each
queue attaches to its shared-memory segment, and what a previous process left in it is
recovered in steps, a bounded part now and the rest while the shard serves
(``recovery.py``) — and recreate its own topics found only in shared memory, attach the
inbound and outbound rings, drain what the inbound rings still hold, serve HTTP, then tell
the supervisor ``ready``. A failure while the worker is built (``ShardWorker()``: the
topics restored, the first bounded part of their recovery, the rings, the TLS context), or a
corrupt log found while recovering later, exits with ``BOOT_ERROR`` after one line on
stderr: the supervisor then stops the whole node. A failure after that (a replacement that
cannot take over, the scan raising, an HTTP server ending) exits with status 1, and the
shard is restarted.

Serving: TCP connections arrive as ``Adopt`` messages (fd + state + unread bytes) and become
``ClientV2`` protocols via ``connect_accepted_socket``. HTTP and HTTPS connections arrive as
``ServeHTTP`` messages (fd), handed out in turn (``supervisor/httpaccept.py``), and are
served by the shard's HTTP server (``HTTPServer.adopt``). Every pass of the broker's 100 ms
scan ends by writing a timestamp into the heartbeat page (``node/heartbeat.py``), so a beat
proves that the scan (timeouts, deferred delivery, deadlines, syncs) makes progress, not only
that the loop turns; disk syncs run on a worker thread (``syncer.py``). A shard silent for
1.5 s gets no new HTTP connections; one that stops beating for ``PYNSQD_SHARD_TIMEOUT`` is
killed by the supervisor, and one whose scan raised exits with status 1 to be restarted.

Exit: ``Quiesce`` (``_stop_serving``: stop delivering, wait a bounded time for FINs, stop
HTTP, close clients) then ``Exit`` (drain the inbound rings, close every queue, send the
final snapshot), from the supervisor, or both at once on SIGTERM when run alone; what each
queue keeps, and where, is docs/architecture.md's "Clean shutdown".

Replacement (a rolling restart, ``supervisor/reload.py``; ``handover.py`` says how): a
worker started *standby* boots without its queues, says ``Standby`` and waits for the
``Handover`` parts of the process it replaces, then adopts its queues and connections and
goes on as above. The process replaced answers ``Drain`` and ``Release``, sends its state and
exits without touching its queues. ``Adopt`` and ``ServeHTTP`` are answered before their
connections are read, so a process that dies first loses none. ``Hold`` and ``Resume``
bracket an upgrade of the supervisor: meanwhile only replies are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import orjson
import uvloop

from pynsqd import __version__, logs
from pynsqd.httpserver import HTTPServer
from pynsqd.node import metadata
from pynsqd.node.boot import BOOT_ERROR, IMPORT_CHECK, BootConfig
from pynsqd.node.control import ControlChannel, Received
from pynsqd.node.datapath import recoverable
from pynsqd.node.heartbeat import Heartbeat
from pynsqd.node.messages import (
    Adopt,
    Changed,
    ConnectionState,
    ControlMessage,
    CreateChannels,
    Done,
    Drain,
    Exit,
    Failed,
    Handover,
    Health,
    HealthRequest,
    Hold,
    HTTPResponse,
    Quiesce,
    Ready,
    Release,
    Resume,
    RunHTTP,
    ServeHTTP,
    SetConfig,
    Snapshot,
    Standby,
    StatsDocument,
    StatsRequest,
    Updated,
)
from pynsqd.node.placement import Placement
from pynsqd.node.tls import build_server_context
from pynsqd.shard import handover
from pynsqd.shard.broker import BrokerHooks
from pynsqd.shard.crossshard import Outbound
from pynsqd.shard.handover import Takeover
from pynsqd.shard.http import NsqdHTTP
from pynsqd.shard.httppub import PublishConnection
from pynsqd.shard.inbound import Inbound
from pynsqd.shard.memory import keep_large_blocks
from pynsqd.shard.node import make_broker, node_info
from pynsqd.shard.nodehttp import NodeHTTP, run_local
from pynsqd.shard.protocol import ClientV2
from pynsqd.shard.recovery import BOOT
from pynsqd.shard.router import ShardRouter
from pynsqd.shard.stats import node_stats
from pynsqd.shm import store
from pynsqd.signals import signals_to

log = logging.getLogger("pynsqd.shard")

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
DRAIN_POLL = 0.01  # seconds between checks for in-flight messages at shutdown


def _prctl(option: int, arg: int | bytes) -> None:
    """``prctl(option, arg)``; nothing where libc has none (the caller's wish is then lost)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL us when the supervisor dies (and check it is still there)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def name_process(index: int) -> None:
    """``nsqd-shard-N`` as this process's name (``/proc/PID/comm``: what ``top``, ``ps -o
    comm`` and ``pgrep`` show), for a forked shard has the supervisor's command line and a
    spawned one Python's."""
    _prctl(PR_SET_NAME, f"nsqd-shard-{index}".encode()[:15])


class ShardWorker:
    """One shard of a multi-shard node."""

    def __init__(self, boot: BootConfig) -> None:
        self.boot = boot
        self.index = boot.index
        self.shards = boot.shards
        self.opts = opts = boot.opts
        self._reporting = False  # topic and channel changes go to the supervisor (once serving)
        self._changed_topics: set[str] = set()  # to send to the supervisor this turn
        self.failed = False  # stopping because the scan or a server failed: exit status 1
        self.boot_failed = False  # stopping because a log could not be recovered: BOOT_ERROR
        self._stop = asyncio.Event()
        self.placement = Placement(opts.data_dir, self.shards)
        self.heartbeat = Heartbeat(boot.heartbeat_fd)
        self.control = ControlChannel(socket.socket(fileno=boot.control_fd), self._on_control,
                                      f"shard {self.index}")
        self.outbound = Outbound(opts.data_dir, self.index, self.shards, boot.wake_fds)
        self.router = ShardRouter(self.placement, self.outbound, self.control)
        hooks = BrokerHooks(on_change=self._changed, on_scan=self.heartbeat.beat, on_fatal=self._fatal,
                            on_recovery_error=self._recovery_failed)
        self.broker = make_broker(opts, boot.log_sizing, shard=self.index, shards=self.shards, router=self.router,
                                  hooks=hooks, start_ns=boot.start_ns)
        if not boot.standby:  # a replacement takes its queues over from ``Handover`` instead
            owned = [t for t in metadata.load(opts.data_dir) if self.placement.owner(t.name) == self.index]
            self.broker.restore(owned)  # each queue attaches to its segment and starts recovering it
            self._adopt_segments()
            self.broker.recovery.run(BOOT)
        self.inbound = Inbound(opts.data_dir, self.index, self.shards, boot.wake_fds[self.index], self.broker)
        self.router.catch_up_with(self.inbound)
        self.tls_ctx = build_server_context(opts)  # the supervisor checked the files already
        self._handlers: dict[type[ControlMessage], Callable[[Any, Received], None]] = {
            Adopt: self._adopt, ServeHTTP: self._serve_http, StatsRequest: self._stats,
            HealthRequest: self._health, RunHTTP: self._run_http, SetConfig: self._set_config,
            CreateChannels: self._create_channels, Quiesce: self._quiesce, Exit: self._exit,
            Drain: self._drain, Release: self._release, Handover: self._handover, Hold: self._hold,
            Resume: self._resume,
        }
        self.takeover = Takeover(self.broker, self._client) if boot.standby else None
        self.handed_over = False  # released to a replacement: exit without touching the queues
        self._pending: set[asyncio.Task[Any]] = set()  # adoptions and proxied calls under way
        self.handoffs = 0
        self._exited = False
        self._http_server: HTTPServer | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._https_server: HTTPServer | None = None
        self._https_task: asyncio.Task[None] | None = None
        self._stopping_service = False
        self.app = NsqdHTTP(self.broker, opts, self.info(), self._persist, self._set_lookupd)
        if boot.https and opts.tls_required == "true":
            self.app.tls_required_port = boot.https_port
        self.node_http = NodeHTTP(self.app, self)

    def _adopt_segments(self) -> None:
        """Segments of topics this shard owns that no queue claimed: recreate the queue when
        the log holds messages (made too late to reach nsqd.dat before a kill -9), remove
        the rest (deleted or ephemeral queues of this shard). Other shards' segments and
        nameless ones (rings) are never touched here; the supervisor sweeps at node start."""
        path = self.opts.data_dir
        claimed = store.claimed_names(path, self.broker.queue_names())

        def mine(kind: str, name: str) -> bool:
            topic = name.partition(":")[0]
            return kind in ("topic", "channel") and bool(topic) and self.placement.owner(topic) == self.index

        for shm_name, kind, name, records in store.leftovers(path, claimed, mine):
            if recoverable(kind, name, records):
                log.warning("%s %s: found in shared memory only; recovering it", kind.upper(), name)
                self.broker.adopt(kind, name)
            else:
                store.unlink_segment(shm_name)

    def info(self) -> dict[str, Any]:
        return node_info(self.opts, self.boot.tcp_port, self.boot.http_port, self.boot.start_time)

    def owner(self, topic: str) -> int:
        """The shard that owns ``topic`` (what ``NodeHTTP`` proxies admin calls to)."""
        return self.router.owner(topic)

    # --- control messages -------------------------------------------------------------------
    def _on_control(self, chan: ControlChannel, received: Received) -> None:
        handler = self._handlers.get(type(received.message))
        if handler is None:
            log.error("unexpected control message %s", received.message.op)
            return
        handler(received.message, received)

    def stats_document(self, msg: StatsRequest) -> dict[str, Any]:
        """This shard's part of the node's stats, its inbound rings drained first (a message
        that got ``OK`` anywhere shows)."""
        self.inbound.drain(None)
        doc = node_stats(self.broker, msg.topic, msg.channel, msg.include_clients, msg.include_mem,
                         msg.include_shards)
        doc["shard_counters"] = {"handoffs": self.handoffs, "relays": self.router.relays,
                                 "cross_shard_sent": self.outbound.sent,
                                 "cross_shard_received": self.inbound.received,
                                 "cross_shard_framed": self.inbound.framed,
                                 "http_pubs": self.app.group.published,
                                 "http_pub_batches": self.app.group.batches}
        return doc

    def _stats(self, msg: StatsRequest, received: Received) -> None:
        self.control.reply(received, StatsDocument(orjson.dumps(self.stats_document(msg))))

    def _health(self, msg: HealthRequest, received: Received) -> None:
        self.control.reply(received, Health(self.broker.health))

    def _run_http(self, msg: RunHTTP, received: Received) -> None:
        self.inbound.drain(None)
        self._track(asyncio.get_running_loop().create_task(self._proxied(msg, received)))

    def _set_config(self, msg: SetConfig, received: Received) -> None:
        self.app.apply_option(msg.opt, msg.value)

    def _create_channels(self, msg: CreateChannels, received: Received) -> None:
        topic = self.broker.topics.get(msg.topic)
        for name in msg.channels:
            if topic is not None:
                self.broker.get_channel(topic, name)

    def _exit(self, msg: Exit, received: Received) -> None:
        self._stop.set()

    def _client(self, state: ConnectionState, unread: bytes) -> ClientV2:
        return ClientV2(self.broker, self.opts, self.tls_ctx, (state, unread))

    def _acknowledge(self, received: Received, then: Callable[[], None]) -> None:
        """Tell the supervisor a handed-over connection is ours (it keeps its copy until
        then), and only once that is in the kernel read from it: a shard that dies before
        leaves the connection unread, for the supervisor to give to another process."""
        if received.rid is not None and not self.control.closed:
            self.control.reply(received, Done())
        self.control.when_sent(then)

    def _adopt(self, msg: Adopt, received: Received) -> None:
        fds = received.take_fds()
        if not fds:  # lost on the way (this process out of descriptors): the supervisor still has it
            if received.rid is not None and not self.control.closed:
                self.control.reply(received, Failed("the connection's descriptor was lost (out of descriptors?)"))
            return
        for extra in fds[1:]:
            os.close(extra)
        sock = socket.socket(fileno=fds[0])
        if self.broker.exiting:
            sock.close()
            return
        self.handoffs += 1
        loop = asyncio.get_running_loop()

        def serve() -> None:
            self._track(loop.create_task(loop.connect_accepted_socket(lambda: self._client(msg.state, msg.unread),
                                                                      sock)))
        self._acknowledge(received, serve)

    def _serve_http(self, msg: ServeHTTP, received: Received) -> None:
        """HTTP (``tls``: HTTPS) connections the supervisor accepted (``supervisor/httpaccept.py``)."""
        server = self._https_server if msg.tls else self._http_server
        loop = asyncio.get_running_loop()
        socks = [socket.socket(fileno=fd) for fd in received.take_fds()]

        def serve() -> None:
            for sock in socks:
                if server is None or server.stopping:  # stopping: the client will reconnect elsewhere
                    sock.close()
                    continue
                self._track(loop.create_task(server.adopt(sock)))
        self._acknowledge(received, serve)

    def _track(self, task: asyncio.Task[Any]) -> None:
        """A connection being adopted, or a proxied admin call: what a release waits for."""
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        task.add_done_callback(_log_failure)

    async def _settle(self) -> None:
        """Until no adoption or proxied call runs, and none is about to start (a reply the
        control channel has not sent yet holds one back)."""
        while True:
            await self.control.sent()
            if not self._pending:
                return
            await asyncio.wait(list(self._pending))

    # --- replacement by a new process (``handover.py``) -------------------------------------
    def _drain(self, msg: Drain, received: Received) -> None:
        task = asyncio.get_running_loop().create_task(self._drained(msg, received))
        task.add_done_callback(_log_failure)

    async def _drained(self, msg: Drain, received: Received) -> None:
        if not await handover.recovered(self.broker):
            self.control.reply(received, Failed("still recovering its logs"))
            return
        self._stopping_service = True  # the HTTP servers may end now: that is no failure
        await self._settle()
        await handover.drain(self.broker, self.control, self._http_server, self._https_server, msg.wait)
        self.control.reply(received, Done())

    def _release(self, msg: Release, received: Received) -> None:
        task = asyncio.get_running_loop().create_task(self._released(received))
        task.add_done_callback(_log_failure)

    async def _released(self, received: Received) -> None:
        try:
            await self._hand_over(received)
        except Exception:  # half handed over, maybe: go, and be recovered as after a crash
            log.exception("the hand-over failed; stopping this process so that it is restarted")
            self.handed_over = True  # leave the queues as they are for the restarted shard
            self._fatal()

    async def _hand_over(self, received: Received) -> None:
        self._stopping_service = True
        await self._settle()
        servers = [s for s in (self._http_server, self._https_server) if s is not None]
        captured = await handover.release(self.broker, servers, list(self.router.live_relays))
        # nothing awaited since the capture: the queues are let go of, now the rings
        self.inbound.stop()
        self._send_update()  # what this turn changed, before the parts
        self.handed_over = True
        handover.send(self.control, captured)
        self.control.reply(received, Done())
        await self.control.sent()
        self._stop.set()

    def _hold(self, msg: Hold, received: Received) -> None:
        """The supervisor is about to re-execute itself: send nothing but replies until it
        says ``Resume``."""
        self.control.reply(received, Done())
        self.control.hold()

    def _resume(self, msg: Resume, received: Received) -> None:
        self.control.release()
        self._send_snapshot()  # the new supervisor's table of topics starts from this
        self.control.reply(received, Done())

    def _handover(self, msg: Handover, received: Received) -> None:
        if self.takeover is None:
            log.error("handover part received by a shard that replaces none")
            return
        self.takeover.receive(msg, received.take_fds())

    async def _proxied(self, msg: RunHTTP, received: Received) -> None:
        status, headers, out = await run_local(self.app, msg, msg.body)
        self.control.reply(received, HTTPResponse(status, headers, out))

    def _persist(self, topic: str) -> None:
        """The topic, a channel of it or a paused flag changed: send what the turn changed to
        the supervisor, for ``nsqd.dat`` (once per turn)."""
        if not self._changed_topics:
            asyncio.get_running_loop().call_soon(self._send_update)
        self._changed_topics.add(topic)

    def _send_update(self) -> None:
        names, self._changed_topics = self._changed_topics, set()
        if names and not self.control.closed:  # (none: a whole snapshot went meanwhile)
            self.control.send(Updated(self.broker.snapshot(names), [n for n in names if n not in self.broker.topics]))

    def _send_snapshot(self) -> None:
        self._changed_topics.clear()  # all of them, from here
        if not self.control.closed:
            self.control.send(Snapshot(self.broker.snapshot()))

    def _set_lookupd(self, addresses: list[str]) -> None:
        self.opts.lookupd_tcp_address = list(addresses)

    def _changed(self, event: str, topic: str, channel: str | None) -> None:
        if not self._reporting:  # before serving: the first snapshot has it
            return
        if not self.control.closed:
            self.control.send(Changed(event, topic, channel))
        self._persist(topic)

    # --- lifecycle --------------------------------------------------------------------------
    def _fatal(self) -> None:
        """The scan failed (``Broker.on_fatal``): exit (status 1) for the supervisor to
        restart this shard; the heartbeat has stopped, so a stuck exit is killed."""
        self.failed = True
        self._stop.set()

    def _recovery_failed(self, exc: Exception) -> None:
        """A log left by a previous process is corrupt: stop, as a boot that found it would."""
        print(f"shard {self.index} failed to boot - {exc}", file=sys.stderr, flush=True)
        self.boot_failed = True
        self._fatal()

    async def main(self) -> None:
        with signals_to(lambda _: self._stop.set(), (signal.SIGTERM,)):
            await self._serve()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.control.start(loop)
        self.control.on_close = lambda chan: self._stop.set()
        if self.takeover is not None and not await self._take_over():
            return
        # the heartbeat: written now, then at the end of every pass of the broker's scan, so it
        # says that the loop turns *and* that the scan (timeouts, deferred delivery, deadlines,
        # syncs) makes progress
        self.heartbeat.beat()
        self.broker.start(loop)
        self._reporting = True
        if self.takeover is not None:
            await self.takeover.connect()
            self.broker.sync_all()  # what the replaced process wrote and did not sync
        self.inbound.start(loop)
        # no listening sockets: the supervisor hands each connection over (``serve_http``)
        connection = functools.partial(PublishConnection, self.node_http, self.app)
        if self.boot.http:
            self._http_server = HTTPServer(connection)
            self._http_task = loop.create_task(self._http_server.serve())
            self._http_task.add_done_callback(self._server_ended)
        if self.boot.https:
            self._https_server = HTTPServer(connection, self.tls_ctx)
            self._https_task = loop.create_task(self._https_server.serve())
            self._https_task.add_done_callback(self._server_ended)
        self._send_snapshot()
        self.control.send(Ready(__version__))
        try:
            await self._stop.wait()
        finally:
            await self.exit()

    async def _take_over(self) -> bool:
        """A replacement: wait for the replaced process's state, then attach its queues. False
        when the node stops first (or the state is unreadable: then it exits to be restarted,
        recovering from shared memory as after a crash)."""
        assert self.takeover is not None
        self.control.send(Standby())
        waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self.takeover.complete.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if self.takeover.failed is not None:
            log.error("cannot take over - %s", self.takeover.failed)
            self.failed = True
        if not self.takeover.complete.is_set() or self.takeover.failed is not None:
            self.handed_over = True  # the queues are not ours: leave them as they are
            return False
        self.takeover.restore_queues()
        self._adopt_segments()
        return True

    def _server_ended(self, task: asyncio.Task[None]) -> None:
        """An HTTP(S) server that ends before this shard stops serving cannot be started
        again in place: the shard exits to be restarted."""
        if self._stopping_service or self._stop.is_set():
            return
        why = "cancelled" if task.cancelled() else repr(task.exception())
        log.error("HTTP server ended unexpectedly (%s); stopping this process so that it is restarted", why)
        self._fatal()

    def _quiesce(self, msg: Quiesce, received: Received) -> None:
        task = asyncio.get_running_loop().create_task(self._quiesced(msg, received))
        task.add_done_callback(_log_failure)

    async def _quiesced(self, msg: Quiesce, received: Received) -> None:
        """Shutdown phase 1: stop delivering, let consumers FIN/REQ what they hold (up to
        ``wait`` seconds), stop HTTP, close every client: nothing publishes any more."""
        await self._stop_serving(msg.wait)
        self.control.reply(received, Done())

    async def _stop_serving(self, wait: float = 0.0) -> None:
        self._stopping_service = True
        clients = list(self.broker.clients)
        for client in clients:
            client.stop_delivery()
        for _ in range(int(wait / DRAIN_POLL)):  # polled: FINs arrive on many connections
            if not any(c.in_flight_count for c in self.broker.clients):
                break
            await asyncio.sleep(DRAIN_POLL)
        for server, task in ((self._http_server, self._http_task), (self._https_server, self._https_task)):
            if server is not None:
                server.stop()
                if task is not None:
                    await task
        self._http_server = self._https_server = None
        held = sum(c.in_flight_count for c in self.broker.clients)
        if held:
            log.info("requeueing %d message(s) still in flight", held)
        for client in list(self.broker.clients):
            client.close()

    async def exit(self) -> None:
        if self._exited:
            return
        self._exited = True
        if self.handed_over:  # another process serves the queues and connections now
            self.outbound.close()
            self.inbound.close()
            self.placement.close()
            return
        await self._stop_serving()
        self.broker.exiting = True
        self.inbound.stop()
        self.inbound.drain(None)
        self.broker.close()
        if not self.control.closed:
            self.control.send(Snapshot(self.broker.snapshot()))
            await asyncio.sleep(0)
        self.inbound.close()
        self.outbound.close()
        self.placement.close()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("shard task failed - %r", task.exception())


def main() -> None:
    """A spawned worker: its config is in the environment."""
    if os.environ.get(IMPORT_CHECK):  # an upgrade's preflight: the installed code imports
        return
    sys.exit(run(BootConfig.from_environment()))


def forked(config: str, fds: list[int]) -> int:
    """A worker forked by the zygote (``node/zygote.py``): its config and descriptors came
    over the zygote's socket. Its exit status."""
    return run(BootConfig.decode(config).with_descriptors(fds))


def run(boot: BootConfig) -> int:
    """Serve as shard ``boot.index`` until told to stop; the exit status."""
    die_with_parent(boot.parent)
    name_process(boot.index)
    # the supervisor coordinates Ctrl-C, reloads and upgrades (a signal sent to the whole
    # process group, or by ``systemctl kill``, must not stop a shard)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    logs.setup(f"{boot.opts.log_prefix}[shard {boot.index}] ", boot.opts.log_level)
    keep_large_blocks()
    try:
        worker = ShardWorker(boot)
    except Exception as exc:
        print(f"shard {boot.index} failed to boot - {exc}", file=sys.stderr, flush=True)
        os._exit(BOOT_ERROR)
    uvloop.run(worker.main())
    if worker.boot_failed:
        return BOOT_ERROR
    return 1 if worker.failed else 0


if __name__ == "__main__":
    main()
