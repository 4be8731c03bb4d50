"""The nsqadmin lifecycle object: bind in the constructor, serve in ``main``, stop on ``exit``.

Theory of operation
-------------------
``AdminNode(options)`` binds the HTTP listener at once (port 0 works; the real address is
logged as ``HTTP: listening on host:port``). ``await node.main()`` serves HTTP and runs the
``/stats`` sampler in one TaskGroup until ``exit()`` (SIGTERM and SIGINT only call it).
Notifications of admin actions (``notify.py``) still under way at shutdown get the request
timeout to finish.
nsqadmin keeps no state of its own beyond the sampled rates: every answer is read from the
cluster when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pynsqd.admin.cluster import Cluster
from pynsqd.admin.config import AdminOptions
from pynsqd.admin.http import AdminHTTP
from pynsqd.admin.notify import Notifier
from pynsqd.admin.sampler import Sampler
from pynsqd.daemon import StopRequest, daemon_logger
from pynsqd.httpserver import app_server
from pynsqd.netaddr import bind, describe
from pynsqd.options import SECOND, version_string


class AdminNode:
    """One nsqadmin. Raises ``UsageError`` from the constructor if the listener cannot bind."""

    def __init__(self, options: AdminOptions, log: logging.Logger | None = None) -> None:
        self.options = options
        self.log = log or daemon_logger("pynsqd.admin", options.log_prefix, options.log_level)
        self.log.info("%s", version_string("nsqadmin"))
        self.http_socket = bind(options.http_address, "http-address")
        self.http_address = describe(self.http_socket)
        self.log.info("HTTP: listening on %s", self.http_address)
        self.cluster = Cluster(options)
        self.sampler = Sampler(self.cluster, options.stats_sample_interval / SECOND, self.log)
        self.notifier = Notifier(options, self.cluster.client, self.log)
        self.http = AdminHTTP(options, self.cluster, self.sampler, self.notifier, self.log)
        self._stop = StopRequest()

    async def main(self) -> None:
        """Serve HTTP and sample until ``exit()``; then shut down and return."""
        with self._stop.armed():
            server = app_server(self.http.app())
            sampler = asyncio.create_task(self.sampler.run())
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(server.serve(self.http_socket))
                    await self._stop.wait()
                    server.stop()
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
                await self.notifier.wait(self.options.http_client_request_timeout / SECOND)
                await self.cluster.close()
        self.log.info("nsqadmin exited")

    def exit(self) -> None:
        """Ask ``main`` to shut down; safe to call more than once, and before ``main``."""
        self._stop.exit()
