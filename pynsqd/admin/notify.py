"""nsqadmin's admin-action notifications (``--notification-http-endpoint``).

Each admin action, once done, is POSTed to the endpoint as nsqadmin's JSON document, in a
background task, so an action's answer never waits for the notification endpoint; a failed
POST is logged. ``wait`` gives the ones under way a bounded time at shutdown.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import time
from typing import Any

import httpx
from starlette.requests import Request

from pynsqd.admin.config import AdminOptions


class Notifier:
    """Sends the notification of each admin action, if an endpoint is configured."""

    def __init__(self, options: AdminOptions, client: httpx.AsyncClient, log: logging.Logger) -> None:
        self.options = options
        self.client = client
        self.log = log
        self.hostname = socket.gethostname()
        self._tasks: set[asyncio.Task[None]] = set()

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
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self, within: float) -> None:
        """Until the notifications under way are sent, or ``within`` seconds."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=within)

    async def _post(self, endpoint: str, body: dict[str, Any]) -> None:
        try:
            response = await self.client.post(endpoint, json=body)
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
