"""The nsqlookupd lifecycle object: bind in the constructor, serve in ``main``, stop on ``exit``.

Theory of operation
-------------------
``LookupNode(options)`` binds the TCP and HTTP listeners at once, so a port of 0 works and
the real address is known (and logged as ``TCP: listening on host:port`` /
``HTTP: listening on host:port``) before anything runs. ``await node.main()`` serves both
on the running loop, in one TaskGroup, until ``exit()`` is called: SIGTERM and SIGINT only
call ``exit()``, which sets an event. Shutdown then stops accepting, closes every producer
connection (each takes its registrations with it) and lets the HTTP server finish in-flight
requests. The registration DB lives in memory only, as in NSQ.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import orjson

from pynsqd import NSQ_VERSION
from pynsqd.daemon import StopRequest, daemon_logger
from pynsqd.httpserver import HTTPServer, app_server
from pynsqd.lookupd.config import LookupdOptions
from pynsqd.lookupd.http import LookupHTTP
from pynsqd.lookupd.registry import RegistrationDB
from pynsqd.lookupd.tcp import LookupProtocol
from pynsqd.netaddr import bind, format_address
from pynsqd.options import UsageError, version_string


class LookupNode:
    """One nsqlookupd. Raises ``UsageError`` from the constructor if a listener cannot bind."""

    def __init__(self, options: LookupdOptions, log: logging.Logger | None = None) -> None:
        self.options = options
        self.log = log or daemon_logger("pynsqd.lookupd", options.log_prefix, options.log_level)
        self.db = RegistrationDB()
        self.connections: set[LookupProtocol] = set()
        self.log.info("%s", version_string("nsqlookupd"))
        self.tcp_socket = bind(options.tcp_address, "tcp-address")
        try:
            self.http_socket = bind(options.http_address, "http-address")
        except UsageError:
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
        self._stop = StopRequest()

    async def main(self) -> None:
        """Serve TCP and HTTP until ``exit()``; then shut both down and return."""
        with self._stop.armed():
            http = app_server(self.http_app)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(http.serve(self.http_socket))
                tg.create_task(self._serve_tcp(http))
        self.log.info("nsqlookupd exited")

    async def _serve_tcp(self, http: HTTPServer) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: LookupProtocol(self.db, self.identify_response, self.log, self.connections),
            sock=self.tcp_socket)
        try:
            await self._stop.wait()
        finally:
            self.log.info("TCP: closing %s", self.tcp_address)
            server.close()
            for conn in list(self.connections):
                conn.close()
            http.stop()
            await server.wait_closed()

    def exit(self) -> None:
        """Ask ``main`` to shut down; safe to call more than once, and before ``main``."""
        self._stop.exit()
