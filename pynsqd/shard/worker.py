"""A shard worker process: ``python -m pynsqd.shard.worker``, started by the supervisor.

Theory of operation
-------------------
The supervisor spawns each worker (a fresh interpreter, never a fork of a running loop) with
everything it needs as inherited file descriptors named in ``PYNSQD_WORKER`` (JSON): its end
of the control socketpair, the heartbeat memory and one eventfd per shard (wake-ups for the
inbound rings). It has no listening socket: the supervisor accepts every connection. The
options come resolved in the same JSON, so a worker never re-reads flags or config files.

Boot: die with the parent (``PR_SET_PDEATHSIG``), build the ``Broker`` with this shard's
index (message ids carry it), restore the topics of ``nsqd.dat`` this shard owns — each
queue attaches to its shared-memory segment and recovers what a previous process left in it
— and recreate its own topics found only in shared memory, attach the inbound and outbound
rings, drain what the inbound rings still hold, serve HTTP, then tell
the supervisor ``ready``. Any failure before that exits with ``BOOT_ERROR`` after one line on
stderr, which stops the supervisor's respawn loop.

Serving: TCP connections arrive as ``adopt`` messages (fd + state + unread bytes) and become
``ClientV2`` protocols via ``connect_accepted_socket``. HTTP and HTTPS connections arrive as
``serve_http`` messages (fd), handed out in turn (``supervisor/httpaccept.py``), and are
served by the embedded HTTP server (``EmbeddedServer.adopt``). Every ``HEARTBEAT_EVERY`` the loop
writes a timestamp into the heartbeat slot. A loop silent for 1.5 s gets no new HTTP
connections; one that stops beating for ``PYNSQD_SHARD_TIMEOUT`` is killed by the supervisor.

Exit (``quiesce`` then ``exit`` from the supervisor, or SIGTERM when run alone): stop
delivering (every consumer is put in CLS's closing state), wait a bounded time for the
messages in flight to be FINed or REQed, stop HTTP, close clients; then drain the inbound
rings, close every queue (their logs stay in shared memory, in-flight and deferred records
as they are, for the next start; disk queues are synced), send the final topic snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import mmap
import os
import signal
import socket
import struct
import sys
import time
from typing import Any

import orjson
import uvloop

from pynsqd import logs
from pynsqd.httpserver import EmbeddedServer, embedded_server
from pynsqd.shard import metadata
from pynsqd.shard.broker import Broker
from pynsqd.shard.config import NsqdOptions
from pynsqd.shard.crossshard import Inbound, Outbound
from pynsqd.shard.http import NsqdHTTP
from pynsqd.shard.node import make_backend, node_info, queue_factory, recoverable
from pynsqd.shard.nodehttp import NodeHTTP, run_local
from pynsqd.shard.protocol import ClientV2
from pynsqd.shard.relay import Relay
from pynsqd.shard.stats import node_stats
from pynsqd.shard.transport import build_server_context
from pynsqd.shm import store
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.shm.sizing import LogSizing
from pynsqd.supervisor.control import ControlChannel
from pynsqd.supervisor.placement import Placement
from pynsqd.supervisor.slots import BOOT_ERROR, ENV

log = logging.getLogger("pynsqd.shard")

HEARTBEAT_EVERY = 0.5  # seconds between heartbeat writes
HEARTBEAT_SLOT = struct.Struct("d")
PR_SET_PDEATHSIG = 1
DRAIN_POLL = 0.01  # seconds between checks for in-flight messages at shutdown


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL us when the supervisor dies (and check it is still there)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class ShardWorker:
    """One shard of a multi-shard node; also the ``Router`` its broker publishes through."""

    def __init__(self, boot: dict[str, Any]) -> None:
        self.boot = boot
        self.index: int = boot["index"]
        self.shards: int = boot["shards"]
        self.opts = NsqdOptions(**boot["opts"])
        opts = self.opts
        self.placement = Placement(opts.data_dir, self.shards)
        self.broker = Broker(opts, self._make_backend, shard=self.index, shards=self.shards,
                             queue_factory=queue_factory(opts, LogSizing(**boot["log_sizing"])))
        self.broker.start_time = boot["start_time"]
        self.broker.start_ns = boot.get("start_ns", self.broker.start_time * 1_000_000_000)
        owned = [t for t in metadata.load(opts.data_dir) if self.placement.owner(t[0]) == self.index]
        self.broker.restore(owned)  # each queue attaches to its segment and recovers it
        self._adopt_segments()
        self.outbound = Outbound(opts.data_dir, self.index, self.shards, boot["wake_fds"])
        self.inbound = Inbound(opts.data_dir, self.index, self.shards, boot["wake_fds"][self.index], self.broker)
        self.broker.router = self
        self.heartbeat = mmap.mmap(boot["heartbeat_fd"], 0)
        self.tls_ctx = build_server_context(opts)  # the supervisor checked the files already
        self.control = ControlChannel(socket.socket(fileno=boot["control_fd"]), self._on_control,
                                      f"shard {self.index}")
        self.handoffs = 0
        self.relays = 0
        self._stop = asyncio.Event()
        self._exited = False
        self._snapshot_pending = False
        self._http_server: EmbeddedServer | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._https_server: EmbeddedServer | None = None
        self._https_task: asyncio.Task[None] | None = None
        self._beat: asyncio.TimerHandle | None = None
        self.app = NsqdHTTP(self.broker, opts, self.info(), self._persist, self._set_lookupd)
        if boot.get("https") and opts.tls_required == "true":
            self.app.tls_required_port = boot["https_port"]
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

    def _make_backend(self, queue_name: str, ephemeral: bool) -> DiskQueue:
        return make_backend(self.opts, queue_name)

    def info(self) -> dict[str, Any]:
        return node_info(self.opts, self.boot["tcp_port"], self.boot["http_port"], self.boot["start_time"])

    # --- Router (what the broker and the connections call) ----------------------------------
    def owner(self, topic: str) -> int:
        return self.placement.owner(topic)

    def forward(self, topic: str, records: list[bytes], body_bytes: int, delay_ns: int) -> None:
        self.outbound.put(self.placement.owner(topic), topic, records, body_bytes, delay_ns)

    def relay(self, client: Any, owner: int, unread: bytes) -> None:
        """Move ``client`` to ``owner`` through a socketpair we pump (``shard/relay.py``)."""
        here, there = socket.socketpair()
        state = client.relay_state()
        try:
            self.control.send({"op": "handoff", "shard": owner, "state": state}, unread, [there.fileno()])
        finally:
            there.close()
        client.detach()
        self.relays += 1
        Relay(client.transport, here, client.decoder)
        log.debug("client(%s) relayed to shard %d", client.remote_address, owner)

    # --- control messages -------------------------------------------------------------------
    def _on_control(self, chan: ControlChannel, msg: dict[str, Any], payload: bytes, fds: list[int]) -> None:
        op = msg.get("op")
        if op == "adopt":
            self._adopt(msg, payload, fds)
        elif op == "serve_http":
            self._serve_http(bool(msg.get("tls")), fds)
        elif op == "stats":
            self.inbound.drain(None)
            doc = node_stats(self.broker, msg.get("topic", ""), msg.get("channel", ""),
                             msg.get("include_clients", True), msg.get("include_mem", True),
                             msg.get("include_shards", False), alone=False)
            doc["shard_counters"] = {"handoffs": self.handoffs, "relays": self.relays,
                                     "cross_shard_sent": self.outbound.sent,
                                     "cross_shard_received": self.inbound.received,
                                     "cross_shard_framed": self.inbound.framed}
            chan.reply(msg, {"ok": True}, orjson.dumps(doc))
        elif op == "health":
            chan.reply(msg, {"ok": True, "health": self.broker.health})
        elif op == "http":
            self.inbound.drain(None)
            task = asyncio.get_running_loop().create_task(self._proxied(chan, msg, payload))
            task.add_done_callback(_log_failure)
        elif op == "config":
            self.app.apply_option(msg["opt"], payload)
        elif op == "create_channels":
            topic = self.broker.topics.get(msg["topic"])
            for name in msg.get("channels", []):
                if topic is not None:
                    self.broker.get_channel(topic, name)
        elif op == "quiesce":
            task = asyncio.get_running_loop().create_task(self._quiesce(chan, msg))
            task.add_done_callback(_log_failure)
        elif op == "exit":
            self._stop.set()
        for fd in fds if op not in ("adopt", "serve_http") else []:
            os.close(fd)

    def _adopt(self, msg: dict[str, Any], payload: bytes, fds: list[int]) -> None:
        if not fds:
            return
        for extra in fds[1:]:
            os.close(extra)
        sock = socket.socket(fileno=fds[0])
        if self.broker.exiting:
            sock.close()
            return
        self.handoffs += 1
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(
            lambda: ClientV2(self.broker, self.opts, self.tls_ctx, (msg.get("state") or {}, payload)), sock))
        task.add_done_callback(_log_failure)

    def _serve_http(self, tls: bool, fds: list[int]) -> None:
        """HTTP (``tls``: HTTPS) connections the supervisor accepted (``supervisor/httpaccept.py``)."""
        server = self._https_server if tls else self._http_server
        loop = asyncio.get_running_loop()
        for fd in fds:
            sock = socket.socket(fileno=fd)
            if server is None or server.should_exit:  # stopping: the client will reconnect elsewhere
                sock.close()
                continue
            loop.create_task(server.adopt(sock)).add_done_callback(_log_failure)

    async def _proxied(self, chan: ControlChannel, msg: dict[str, Any], body: bytes) -> None:
        status, headers, out = await run_local(self.app, msg, body)
        chan.reply(msg, {"status": status, "headers": headers}, out)

    def _persist(self) -> None:
        """Topics or pauses changed: send the snapshot to the supervisor (once per turn)."""
        if not self._snapshot_pending:
            self._snapshot_pending = True
            asyncio.get_running_loop().call_soon(self._send_snapshot)

    def _send_snapshot(self) -> None:
        self._snapshot_pending = False
        if not self.control.closed:
            self.control.send({"op": "snapshot", "topics": self.broker.snapshot()})

    def _set_lookupd(self, addresses: list[str]) -> None:
        self.opts.lookupd_tcp_address = list(addresses)

    def _changed(self, event: str, topic: str, channel: str | None) -> None:
        if not self.control.closed:
            self.control.send({"op": "changed", "event": event, "topic": topic, "channel": channel})
        self._persist()

    # --- lifecycle --------------------------------------------------------------------------
    def _beat_now(self) -> None:
        HEARTBEAT_SLOT.pack_into(self.heartbeat, 0, time.monotonic())
        self._beat = asyncio.get_running_loop().call_later(HEARTBEAT_EVERY, self._beat_now)

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        self.control.start(loop)
        self.control.on_close = lambda chan: self._stop.set()
        self._beat_now()
        self.broker.start(loop)
        self.broker.on_change = self._changed
        self.inbound.start(loop)
        # no listening sockets: the supervisor hands each connection over (``serve_http``)
        if self.boot.get("http"):
            self._http_server = embedded_server(self.node_http, publisher=self.app)
            self._http_task = loop.create_task(self._http_server.serve(sockets=[]))
        if self.boot.get("https"):
            self._https_server = embedded_server(self.node_http, self.tls_ctx, self.app)
            self._https_task = loop.create_task(self._https_server.serve(sockets=[]))
        self._send_snapshot()
        self.control.send({"op": "ready", "pid": os.getpid()})
        try:
            await self._stop.wait()
        finally:
            await self.exit()

    async def _quiesce(self, chan: ControlChannel, msg: dict[str, Any]) -> None:
        """Shutdown phase 1: stop delivering, let consumers FIN/REQ what they hold (up to
        ``wait`` seconds), stop HTTP, close every client: nothing publishes any more."""
        await self._stop_serving(float(msg.get("wait", 0)))
        chan.reply(msg, {"ok": True})

    async def _stop_serving(self, wait: float = 0.0) -> None:
        clients = list(self.broker.clients)
        for client in clients:
            client.stop_delivery()
        for _ in range(int(wait / DRAIN_POLL)):  # polled: FINs arrive on many connections
            if not any(c.in_flight_count for c in self.broker.clients):
                break
            await asyncio.sleep(DRAIN_POLL)
        for server, task in ((self._http_server, self._http_task), (self._https_server, self._https_task)):
            if server is not None:
                server.should_exit = True
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
        await self._stop_serving()
        self.broker.exiting = True
        self.inbound.stop()
        self.inbound.drain(None)
        self.broker.close()
        if not self.control.closed:
            self.control.send({"op": "snapshot", "topics": self.broker.snapshot(), "final": True})
            await asyncio.sleep(0)
        self.inbound.close()
        self.outbound.close()
        self.placement.close()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("shard task failed - %r", task.exception())


def main() -> None:
    boot = orjson.loads(os.environ.pop(ENV))
    die_with_parent(boot["parent"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor coordinates Ctrl-C
    opts = boot["opts"]
    logs.setup(f"{opts['log_prefix']}[shard {boot['index']}] ", opts["log_level"])
    try:
        worker = ShardWorker(boot)
    except Exception as exc:
        print(f"shard {boot['index']} failed to boot - {exc}", file=sys.stderr, flush=True)
        os._exit(BOOT_ERROR)
    uvloop.run(worker.main())


if __name__ == "__main__":
    main()
