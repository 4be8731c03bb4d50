"""The lifecycle of a running nsqd shard: bind, serve, exit (nsqd's New/Main/Exit).

``NsqdNode(opts)`` binds the TCP and HTTP listeners and locks the data path in the
constructor, so a port of 0 works and the caller knows the real addresses before serving.
``main()`` serves until ``stop()`` (or SIGTERM/SIGINT, whose handlers only set an event),
then ``exit()`` shuts down in phases: stop accepting, close client connections, persist
every queue (in-flight and deferred messages go back to their queues, memory to disk),
stop HTTP, release the data-path lock. Calling ``exit()`` twice is harmless.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import socket
import ssl
import time

from pynsqd import NSQ_VERSION, __version__
from pynsqd.httpserver import EmbeddedServer, embedded_server
from pynsqd.netaddr import bind, bound_port, describe
from pynsqd.options import UsageError
from pynsqd.shard import metadata
from pynsqd.shard.broker import Broker
from pynsqd.shard.config import NsqdOptions
from pynsqd.shard.http import NsqdHTTP
from pynsqd.shard.protocol import ClientV2
from pynsqd.shard.stats import node_stats
from pynsqd.shard.statsd import StatsdLines, StatsdPusher, statsd_prefix
from pynsqd.shard.transport import build_server_context
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.supervisor.registration import Registration
from pynsqd.wire.lookup import IdentifyInfo
from pynsqd.wire.message import MIN_MESSAGE_SIZE
from pynsqd.wire.names import is_ephemeral, is_valid_name

log = logging.getLogger("pynsqd.shard")




class NsqdNode:
    """One nsqd node served by a single shard process."""

    def __init__(self, opts: NsqdOptions) -> None:
        self.opts = opts
        self._lock_fd = self._lock_data_path(opts.data_dir)
        self.broker = Broker(opts, self._make_backend)
        try:
            self.broker.restore(metadata.load(opts.data_dir))
        except ValueError as exc:
            os.close(self._lock_fd)
            raise UsageError(f"failed to load metadata - {exc}") from None
        self._save_pending = False
        self._background: set[asyncio.Task[None]] = set()
        self.registration = Registration(self.identity, self.broker.registrations, opts.max_body_size)
        try:
            self.tls_ctx = build_server_context(opts)
        except (OSError, ssl.SSLError) as exc:
            os.close(self._lock_fd)
            raise UsageError(f"failed to load TLS certificate/key: {exc}") from None
        self.tcp_socket: socket.socket = bind(opts.tcp_address, "tcp-address")
        self.http_socket: socket.socket | None = (
            bind(opts.http_address, "http-address") if opts.http_address else None)
        self.https_socket: socket.socket | None = (
            bind(opts.https_address, "https-address") if opts.https_address and self.tls_ctx else None)
        self._https_server: EmbeddedServer | None = None
        self._https_task: asyncio.Task[None] | None = None
        self._statsd_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._exited = False
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_server: EmbeddedServer | None = None
        self._http_task: asyncio.Task[None] | None = None

    @staticmethod
    def _lock_data_path(path: str) -> int:
        try:
            os.makedirs(path, exist_ok=True)
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise UsageError(f"failed to open --data-path={path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UsageError(f"--data-path={path} in use (possibly by another instance of nsqd)") from None
        return fd

    def _make_backend(self, queue_name: str, ephemeral: bool) -> DiskQueue:
        opts = self.opts
        return DiskQueue(queue_name, opts.data_dir, max_bytes_per_file=opts.max_bytes_per_file,
                         min_msg_size=MIN_MESSAGE_SIZE, max_msg_size=opts.max_msg_size + MIN_MESSAGE_SIZE,
                         sync_every=opts.sync_every, sync_timeout_ns=opts.sync_timeout, logger=log)

    def save_metadata(self) -> None:
        """Write ``nsqd.dat`` now (pause/unpause, exit)."""
        self._save_pending = False
        try:
            metadata.save(self.opts.data_dir, metadata.encode(self.broker.snapshot()))
        except OSError as exc:
            log.error("failed to persist metadata - %s", exc)

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """``--lookupd-tcp-address`` at start, ``PUT /config/nsqlookupd_tcp_addresses`` later."""
        self.opts.lookupd_tcp_address = list(addresses)
        self.registration.set_addresses(self.opts.lookupd_tcp_address)

    def identity(self) -> IdentifyInfo:
        """What this node tells nsqlookupd about itself."""
        return IdentifyInfo(broadcast_address=self.opts.broadcast_address,
                            tcp_port=self.opts.broadcast_tcp_port or self.tcp_port,
                            http_port=self.opts.broadcast_http_port or self.http_port,
                            version=NSQ_VERSION, hostname=socket.gethostname())

    def _changed(self, event: str, topic: str, channel: str | None) -> None:
        """A topic or channel came or went: tell lookupd, save metadata soon (once per burst),
        and for a new topic pre-create the channels lookupd knows of."""
        self.registration.changed(event, topic, channel)
        loop = asyncio.get_running_loop()
        if not self._save_pending:
            self._save_pending = True
            loop.call_soon(self.save_metadata)
        if event == "created" and channel is None and self.registration.peers:
            task = loop.create_task(self._precreate_channels(topic))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _precreate_channels(self, topic_name: str) -> None:
        for name in sorted(await self.registration.channels_for(topic_name)):
            topic = self.broker.topics.get(topic_name)
            if topic is not None and not is_ephemeral(name) and is_valid_name(name):
                self.broker.get_channel(topic, name)

    @property
    def tcp_port(self) -> int:
        return bound_port(self.tcp_socket)

    @property
    def http_port(self) -> int:
        return bound_port(self.http_socket) if self.http_socket else -1

    def info(self) -> dict[str, object]:
        """The static part of ``/info``."""
        return {
            "broadcast_address": self.opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.http_port,
            "tcp_port": self.tcp_port,
            "start_time": self.broker.start_time,
            "max_heartbeat_interval": self.opts.max_heartbeat_interval,
            "max_output_buffer_size": self.opts.max_output_buffer_size,
            "max_output_buffer_timeout": self.opts.max_output_buffer_timeout,
            "max_deflate_level": self.opts.max_deflate_level,
        }

    def _statsd(self) -> StatsdPusher:
        opts = self.opts
        prefix = statsd_prefix(opts.statsd_prefix, opts.broadcast_address, opts.broadcast_http_port or self.http_port)
        lines = StatsdLines(prefix, opts.statsd_mem_stats, opts.statsd_exclude_ephemeral)
        return StatsdPusher(opts.statsd_address, opts.statsd_interval, opts.statsd_udp_packet_size, lines,
                            lambda: node_stats(self.broker, include_clients=False))

    def stop(self) -> None:
        """Ask ``main`` to exit (safe from a signal handler)."""
        self._stop.set()

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        log.info("pynsqd %s (nsqd v%s compatible)", __version__, NSQ_VERSION)
        log.info("ID: %d", self.opts.node_id)
        self.broker.start(loop)
        self.save_metadata()
        self.broker.on_change = self._changed
        self.set_lookupd_addresses(self.opts.lookupd_tcp_address)
        self._tcp_server = await loop.create_server(
            lambda: ClientV2(self.broker, self.opts, self.tls_ctx), sock=self.tcp_socket, backlog=1024)
        log.info("TCP: listening on %s", describe(self.tcp_socket))
        app = NsqdHTTP(self.broker, self.opts, self.info(), self.save_metadata, self.set_lookupd_addresses)
        if self.https_socket is not None and self.opts.tls_required == "true":
            app.tls_required_port = bound_port(self.https_socket)
        if self.http_socket is not None:
            self._http_server = embedded_server(app)
            self._http_task = asyncio.create_task(self._http_server.serve(sockets=[self.http_socket]))
            log.info("HTTP: listening on %s", describe(self.http_socket))
        if self.https_socket is not None:
            self._https_server = embedded_server(app, self.tls_ctx)
            self._https_task = asyncio.create_task(self._https_server.serve(sockets=[self.https_socket]))
            log.info("HTTPS: listening on %s", describe(self.https_socket))
        if self.opts.statsd_address:
            self._statsd_task = asyncio.create_task(self._statsd().run())
        try:
            await self._stop.wait()
        finally:
            await self.exit()

    async def exit(self) -> None:
        if self._exited:
            return
        self._exited = True
        started = time.monotonic()
        if self._tcp_server is not None:
            self._tcp_server.close()
        self.broker.exiting = True
        clients = list(self.broker.clients)
        for client in clients:
            client.close()
        if clients:
            log.info("closed %d client connection(s)", len(clients))
        self.save_metadata()
        self.broker.close()
        await self.registration.close()
        if self._statsd_task is not None:
            self._statsd_task.cancel()
        for server, task in ((self._http_server, self._http_task), (self._https_server, self._https_task)):
            if server is not None:
                server.should_exit = True
                if task is not None:
                    await task
        os.close(self._lock_fd)
        log.info("exited cleanly in %.3fs", time.monotonic() - started)
