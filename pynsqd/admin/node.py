"""The nsqadmin lifecycle object: bind in the constructor, serve in ``main``, stop on ``exit``.

Theory of operation
-------------------
``AdminNode(options)`` binds the HTTP listener at once (port 0 works; the real address is
logged as ``HTTP: listening on host:port``). ``await node.main()`` serves HTTP and runs the
``/stats`` sampler in one TaskGroup until ``exit()`` (SIGTERM and SIGINT only call it).
Notifications of admin actions are POSTed in background tasks so an action's answer never
waits for the notification endpoint; shutdown gives them the request timeout to finish.
nsqadmin keeps no state of its own beyond the sampled rates: every answer is read from the
cluster when asked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import time
from typing import Any

from starlette.requests import Request

from pynsqd.admin.cluster import Cluster
from pynsqd.admin.config import AdminOptions
from pynsqd.admin.http import AdminHTTP
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
        self.hostname = socket.gethostname()
        self.cluster = Cluster(options)
        self.sampler = Sampler(self.cluster, options.stats_sample_interval / SECOND, self.log)
        self.http = AdminHTTP(self)
        self._notifications: set[asyncio.Task[None]] = set()
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
                if self._notifications:
                    await asyncio.wait(self._notifications,
                                       timeout=self.options.http_client_request_timeout / SECOND)
                await self.cluster.close()
        self.log.info("nsqadmin exited")

    def exit(self) -> None:
        """Ask ``main`` to shut down; safe to call more than once, and before ``main``."""
        self._stop.exit()

    # --- notifications --------------------------------------------------------------------

    def notify(self, action: str, topic: str, channel: str, node: str, request: Request) -> None:
        """Send nsqadmin's admin-action notification (if an endpoint is configured)."""
        endpoint = self.options.notification_http_endpoint
        if not endpoint:
            return
        body: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            body["channel"] = channel
        if node:
            body["node"] = node
        body["timestamp"] = int(time.time())
        user = _basic_auth_user(request) or request.headers.get(self.options.acl_http_header, "")
        if user:
            body["user"] = user
        body.update({"remote_ip": request.client.host if request.client else "",
                     "user_agent": request.headers.get("user-agent", ""), "url": _request_uri(request),
                     "via": self.hostname})
        task = asyncio.create_task(self._post(endpoint, body))
        self._notifications.add(task)
        task.add_done_callback(self._notifications.discard)

    async def _post(self, endpoint: str, body: dict[str, Any]) -> None:
        try:
            response = await self.cluster.client.post(endpoint, json=body)
            if response.status_code >= 300:
                self.log.error("notification to %s failed - status %d", endpoint, response.status_code)
        except Exception as exc:
            self.log.error("notification to %s failed - %s", endpoint, exc)


def _request_uri(request: Request) -> str:
    """The request's path and query, as Go's server-side ``req.URL.String()`` gives them."""
    query = request.url.query
    return request.url.path + ("?" + query if query else "")


def _basic_auth_user(request: Request) -> str:
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("basic "):
        return ""
    try:
        decoded = base64.b64decode(header[6:]).decode("utf-8", "replace")
    except ValueError:
        return ""
    return decoded.partition(":")[0]
