"""The HTTP API of a multi-shard node, served by every shard on the connections handed to it.

Theory of operation
-------------------
``NodeHTTP`` wraps a shard's own ``NsqdHTTP`` and decides, per request, where it runs:

- ``/pub``, ``/mpub``: here. The broker sends a batch for a topic owned elsewhere into the
  owner's inbound ring (``crossshard.py``) — no round trip, ``OK`` once it is in shm.
- ``/topic/*``, ``/channel/*``: at the topic's owner. When that is another shard, the request
  (method, path, query, body) goes through the supervisor to the owner, which runs it through
  its own ``NsqdHTTP`` (``run_local``) and sends back status, headers and body verbatim, so
  every answer and error is exactly the single-node one. An owner that is down (killed,
  restarting) or silent for ``PROXY_WAIT`` seconds makes it nsqd's answer to an operation
  that failed inside: ``500 INTERNAL_ERROR`` (and an error in the log).
- ``/stats``, ``/metrics``: the supervisor collects every other shard's stats document and
  passes them on unparsed while this shard makes its own; this shard merges them into one
  node (``node/aggregate.py``); the formats (JSON, text, Prometheus) are rendered from that
  one document by the same code a single shard uses. Only this app has these routes (GET and
  HEAD; another method 405, a trailing slash redirected, as ``NsqdHTTP`` answers its own).
- ``PUT /config/…``: applied here, then by the supervisor on every other shard (node-wide).
- ``/ping``: the node's health — this shard's if it is not OK, else the first shard's that
  is not (asked through the supervisor), so a failing disk on any shard shows on every ``/ping``.
- anything else (``/info``, ``GET /config``, bad requests): here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from pynsqd.httpkit import TEXT_TYPE, HTTPError, RouteTable, api_response, error_response, parse_query
from pynsqd.node.aggregate import merge_stats
from pynsqd.node.control import CALL_WAIT, PROXY_WAIT, ControlChannel
from pynsqd.node.messages import (
    Failed,
    Health,
    HealthRequest,
    HTTPResponse,
    Proxy,
    RunHTTP,
    SetConfig,
    ShardDocuments,
    StatsRequest,
)
from pynsqd.shard.http import NsqdHTTP, requests, responses, route_miss, send_answer
from pynsqd.shard.metrics import CONTENT_TYPE as PROMETHEUS_TYPE
from pynsqd.shard.metrics import exposition
from pynsqd.shard.stats import format_text, stats_request
from pynsqd.wire.names import is_valid_name

if TYPE_CHECKING:
    from starlette.responses import Response

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
log = logging.getLogger("pynsqd.shard")


class Shard(Protocol):
    index: int
    control: ControlChannel

    def owner(self, topic: str) -> int: ...

    def stats_document(self, msg: StatsRequest) -> dict[str, Any]: ...


async def run_local(app: NsqdHTTP, msg: RunHTTP, body: bytes) -> tuple[int, list[list[str]], bytes]:
    """Run a proxied request through ``app``; → (status, headers, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": msg.method, "path": msg.path, "raw_path": msg.path.encode(),
             "query_string": msg.query.encode("latin-1"), "root_path": "",
             # the shard the request reached already applied --tls-required to it
             "scheme": msg.scheme, "headers": [[b"content-length", b"%d" % len(body)]],
             "client": None, "server": None}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    status = 500
    headers: list[list[str]] = []
    out: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, headers, b"".join(out)


async def _read_all(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_raw(send: Send, status: int, headers: list[list[str]], body: bytes) -> None:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class NodeHTTP:
    """ASGI app: one node's HTTP API over several shards (see the module doc)."""

    def __init__(self, app: NsqdHTTP, shard: Shard) -> None:
        self.app = app
        self.shard = shard
        self.routes: RouteTable[Callable[[dict[str, Any]], Awaitable[Response]]] = RouteTable([
            ("GET", "/stats", self._stats),
            ("GET", "/metrics", self._stats),
        ])

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.app.tls_required_port and scope.get("scheme") != "https"):
            await self.app(scope, receive, send)  # (the latter: 403 TLS_REQUIRED)
            return
        path = scope["path"]
        method = scope["method"]
        try:
            if path.startswith(("/stats", "/metrics")):
                match = self.routes.match("GET" if method == "HEAD" else method, path)
                response = (await match.handler(scope) if match.handler is not None
                            else route_miss(self.routes, match, requests.Request(scope, receive)))
                if response is not None:
                    await response(scope, receive, send)
                    return
            if path == "/ping" and method in ("GET", "HEAD"):  # answered without the framework
                health = self.app.broker.health
                if health == "OK":
                    health = await self._node_health()
                await send_answer(send, 200 if health == "OK" else 500, health.encode(), TEXT_TYPE, nsq_header=False)
                return
            if path.startswith(("/topic/", "/channel/")):
                owner = self._owner_of(scope)
                if owner is not None and owner != self.shard.index:
                    await self._proxy(owner, scope, receive, send)
                    return
            if path.startswith("/config/") and method == "PUT":
                await self._config(scope, receive, send)
                return
        except HTTPError as exc:
            await error_response(exc.status, exc.message)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _node_health(self) -> str:
        try:
            reply = await self.shard.control.call(HealthRequest(), wait=CALL_WAIT)
        except (ConnectionError, TimeoutError):
            return "OK"  # the supervisor is going away; this shard's own health stands
        return reply.health if isinstance(reply, Health) else "OK"

    def _owner_of(self, scope: dict[str, Any]) -> int | None:
        try:
            params = parse_query(scope.get("query_string", b""))
        except HTTPError:
            return None  # the local app answers the error
        topic = (params.get("topic") or [""])[0]
        return self.shard.owner(topic) if is_valid_name(topic) else None  # else: a local 400

    async def _proxy(self, owner: int, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        body = await _read_all(receive)
        msg = Proxy(owner, scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1"),
                    scope.get("scheme", "http"), body)
        try:
            reply = await self.shard.control.call(msg, wait=PROXY_WAIT + 1)
        except (ConnectionError, TimeoutError) as exc:
            reply = Failed(f"the supervisor did not answer - {exc!r}")
        if not isinstance(reply, HTTPResponse):  # the owner is down: nsqd's answer to an operation that failed
            log.error("HTTP %s %s failed - %s", scope["method"], scope["path"],
                      reply.error if isinstance(reply, Failed) else reply.op)
            raise HTTPError(500, "INTERNAL_ERROR")
        await _send_raw(send, reply.status, reply.headers, reply.body)

    async def _config(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        body = await _read_all(receive)
        msg = RunHTTP("PUT", scope["path"], scope.get("query_string", b"").decode("latin-1"),
                      scope.get("scheme", "http"))
        status, headers, out = await run_local(self.app, msg, body)
        if status == 200:
            self.shard.control.send(SetConfig(scope["path"][len("/config/"):], body))
        await _send_raw(send, status, headers, out)

    async def _stats(self, scope: dict[str, Any]) -> Response:
        params = parse_query(scope.get("query_string", b""))
        fmt = (params.get("format") or [""])[0]
        prometheus = scope["path"] == "/metrics" or fmt == "prometheus"
        request = StatsRequest(**stats_request(params), skip=self.shard.index)
        if prometheus:  # pynsqd's own figures are metrics too; Go's memory figures are not
            request = request.replace(include_mem=False, include_shards=True)
        call = asyncio.ensure_future(self.shard.control.call(request, wait=CALL_WAIT))
        await asyncio.sleep(0)  # the request is sent: the other shards make theirs while this one does
        own = self.shard.stats_document(request)
        try:
            reply = await call
        except (ConnectionError, TimeoutError) as exc:
            log.error("HTTP %s failed - the supervisor did not answer - %r", scope["path"], exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        if not isinstance(reply, ShardDocuments):
            log.error("HTTP %s failed - the supervisor answered %s", scope["path"], reply.op)
            raise HTTPError(500, "INTERNAL_ERROR")
        node = orjson.loads(reply.docs)
        docs = {int(i): d for i, d in node["docs"]}
        docs[self.shard.index] = own
        doc = merge_stats([docs[i] for i in sorted(docs)], node["supervisor"], request.topic)
        doc["start_time"] = node["start_time"]
        if prometheus:
            return responses.Response(exposition(doc, self.app.opts.data_dir), media_type=PROMETHEUS_TYPE)
        if fmt == "json":
            return api_response(doc)
        return api_response(format_text(doc, start_ns=self.app.broker.start_ns))
