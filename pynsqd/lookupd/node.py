"""The nsqlookupd lifecycle object: bind in the constructor, serve in ``main``, stop on ``exit``.

Theory of operation
-------------------
``LookupNode(options)`` binds the TCP and HTTP listeners at once, so a port of 0 works and
the real address is known (and logged as ``TCP: listening on host:port`` /
``HTTP: listening on host:port``) before anything runs. ``await node.main()`` serves both
on the running loop, in one TaskGroup, until ``exit()`` is called: SIGTERM and SIGINT only
call ``exit()``, which sets an event. Shutdown then stops accepting, closes every producer
connection (each takes its registrations with it) and lets uvicorn finish in-flight HTTP
requests. The registration DB lives in memory only, as in NSQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import Iterator

import orjson
import uvicorn

from pynsqd import NSQ_VERSION, __version__
from pynsqd.lookupd.config import LookupdOptions, split_address
from pynsqd.lookupd.http import LookupHTTP
from pynsqd.lookupd.registry import RegistrationDB
from pynsqd.lookupd.tcp import LookupProtocol, format_address

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "error": logging.ERROR, "fatal": logging.CRITICAL}
_LEVEL_NAMES = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING",
                logging.ERROR: "ERROR", logging.CRITICAL: "FATAL"}


class NSQFormatter(logging.Formatter):
    """``<prefix>2006/01/02 15:04:05.000000 LEVEL: message``, as NSQ's logger writes."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(record.created))
        micros = int(record.created % 1 * 1_000_000)
        level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        text = f"{self.prefix}{stamp}.{micros:06d} {level}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def make_logger(prefix: str, level: str, name: str = "pynsqd.lookupd") -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(NSQFormatter(prefix))
    log.addHandler(handler)
    log.setLevel(_LEVELS[level])
    log.propagate = False
    uv = logging.getLogger("uvicorn.error")  # uvicorn's own problems, in our format
    uv.handlers[:] = [handler]
    uv.setLevel(logging.WARNING)
    uv.propagate = False
    return log


def bind(address: str, flag_name: str) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (port 0 picks a free one)."""
    host, port = split_address(address, flag_name)
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class _HTTPServer(uvicorn.Server):
    """uvicorn, minus its signal handling: the node owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class LookupNode:
    """One nsqlookupd. Raises ``OSError`` from the constructor if a listener cannot bind."""

    def __init__(self, options: LookupdOptions, log: logging.Logger | None = None) -> None:
        self.options = options
        self.log = log or make_logger(options.log_prefix, options.log_level)
        self.db = RegistrationDB()
        self.connections: set[LookupProtocol] = set()
        self.log.info("nsqlookupd v%s (built w/pynsqd %s)", NSQ_VERSION, __version__)
        self.tcp_socket = self._bind(options.tcp_address, "tcp-address")
        try:
            self.http_socket = self._bind(options.http_address, "http-address")
        except OSError:
            self.tcp_socket.close()
            raise
        self.tcp_address = format_address(self.tcp_socket.getsockname())
        self.http_address = format_address(self.http_socket.getsockname())
        self.log.info("TCP: listening on %s", self.tcp_address)
        self.log.info("HTTP: listening on %s", self.http_address)
        self.identify_response = orjson.dumps({
            "broadcast_address": options.broadcast_address, "hostname": socket.gethostname(),
            "http_port": self.http_socket.getsockname()[1],
            "tcp_port": self.tcp_socket.getsockname()[1], "version": NSQ_VERSION,
        }, option=orjson.OPT_SORT_KEYS)
        self.http_app = LookupHTTP(self.db, options.inactive_producer_timeout,
                                   options.tombstone_lifetime, self.log)
        self._stopping: asyncio.Event | None = None
        self._exit_requested = False

    def _bind(self, address: str, flag_name: str) -> socket.socket:
        try:
            return bind(address, flag_name)
        except OSError as exc:
            self.log.critical("listen (%s) failed - %s", address, exc.strerror or exc)
            raise

    async def main(self) -> None:
        """Serve TCP and HTTP until ``exit()``; then shut both down and return."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._exit_requested:
            self._stopping.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.exit)
        http = _HTTPServer(uvicorn.Config(
            self.http_app, log_config=None, access_log=False, lifespan="off",
            server_header=False, http="h11", timeout_graceful_shutdown=5,
        ))
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(http.serve(sockets=[self.http_socket]))
                tg.create_task(self._serve_tcp(http))
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        self.log.info("nsqlookupd exited")

    async def _serve_tcp(self, http: uvicorn.Server) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: LookupProtocol(self.db, self.identify_response, self.log, self.connections),
            sock=self.tcp_socket)
        assert self._stopping is not None
        try:
            await self._stopping.wait()
        finally:
            self.log.info("TCP: closing %s", self.tcp_address)
            server.close()
            for conn in list(self.connections):
                conn.close()
            http.should_exit = True
            await server.wait_closed()

    def exit(self) -> None:
        """Ask ``main`` to shut down; safe to call more than once, and before ``main``."""
        self._exit_requested = True
        if self._stopping is not None:
            self._stopping.set()
