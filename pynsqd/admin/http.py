"""nsqadmin's HTTP server: the ``/api`` routes, ``/config``, the pages and their assets.

Theory of operation
-------------------
``AdminHTTP`` is a plain ASGI app. It strips ``--base-path`` (anything outside it is 404),
then matches the path against a table of ``(method, pattern, handler)`` as nsqadmin's
httprouter does (``httpkit.RouteTable``): an unknown path is 404 ``NOT_FOUND``, a known path
with another method 405 ``METHOD_NOT_ALLOWED``, a GET with a trailing slash 301. API
handlers return data or raise ``HTTPError``; ``AllFailed`` from the cluster becomes 502
``UPSTREAM_ERROR: <why>``; partial failures become a 200 whose ``message`` is ``WARNING:
<why>; <why>``. JSON goes out as NSQ's ``internal/http_api`` V1 writes it
(``application/json; charset=utf-8``, ``X-NSQ-Content-Type: nsq; version=1.0``,
``{"message": CODE}`` for errors). Every POST/DELETE under ``/api`` is privileged: with
``--admin-user`` set, the ``--acl-http-header`` value must name one of them, else 403
``FORBIDDEN``. Each action, once done, sends the notification POST (``notify.py``).
Responses are gzip-compressed for clients that accept it (as nsqadmin does).

Beyond NSQ: ``GET /api/rates`` serves nsqadmin's own sampled message rates (see
``sampler``) for the pages' graphs and the topics overview.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pynsqd import logs
from pynsqd.admin import actions
from pynsqd.admin.aggregate import node_topic, total_channel, total_topic
from pynsqd.admin.cluster import AllFailed, Cluster
from pynsqd.admin.config import AdminOptions
from pynsqd.admin.notify import Notifier
from pynsqd.admin.pages import PAGES, render_index
from pynsqd.admin.sampler import Sampler
from pynsqd.httpkit import HTTPError, RouteTable, error_response, json_response
from pynsqd.options import SECOND, config_value
from pynsqd.wire.names import is_valid_name

Handler = Callable[[Request, dict[str, str]], Awaitable[Any]]
_STATIC_TYPES = {".js": "application/javascript", ".css": "text/css; charset=utf-8",
                 ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon"}


def warn(messages: list[str]) -> str:
    return "WARNING: " + "; ".join(messages) if messages else ""


class AdminHTTP:
    """The ASGI app of one nsqadmin (wrapped in gzip by ``app()``)."""

    def __init__(self, options: AdminOptions, cluster: Cluster, sampler: Sampler, notifier: Notifier,
                 log: logging.Logger) -> None:
        self.options = options
        self.cluster = cluster
        self.sampler = sampler
        self.notify = notifier.notify
        self.log = log
        self.base = "" if self.options.base_path == "/" else self.options.base_path
        self.static_dir = Path(self.options.dev_static_dir) if self.options.dev_static_dir else None
        self.assets = "dev" if self.static_dir else _assets_hash()
        table: list[tuple[str, str, Handler]] = [("GET", "/ping", self.ping)]
        table += [("GET", page, self.index) for page in PAGES]
        table += [
            ("GET", "/static/:asset", self.static), ("GET", "/fonts/:asset", self.static),
            ("GET", "/api/topics", self.topics), ("GET", "/api/topics/:topic", self.topic),
            ("GET", "/api/topics/:topic/:channel", self.channel), ("GET", "/api/nodes", self.nodes),
            ("GET", "/api/nodes/:node", self.node_detail), ("POST", "/api/topics", self.create),
            ("POST", "/api/topics/:topic", self.action), ("POST", "/api/topics/:topic/:channel", self.action),
            ("DELETE", "/api/nodes/:node", self.tombstone), ("DELETE", "/api/topics/:topic", self.delete),
            ("DELETE", "/api/topics/:topic/:channel", self.delete), ("GET", "/api/counter", self.counter),
            ("GET", "/api/graphite", self.graphite), ("GET", "/api/rates", self.rates),
            ("GET", "/config/:opt", self.config), ("PUT", "/config/:opt", self.config),
        ]
        if self.options.proxy_graphite:
            table.append(("GET", "/render", self.render_proxy))
        self.routes: RouteTable[Handler] = RouteTable(table)

    def app(self) -> Any:
        return GZipMiddleware(self, minimum_size=1024)

    # --- dispatch -------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if self.base:
            if path == self.base:
                path = "/"
            elif path.startswith(self.base + "/"):
                path = path[len(self.base):]
            else:
                await error_response(404, "NOT_FOUND")(scope, receive, send)
                return
        method = scope["method"]
        match = self.routes.match(method, path)
        if match.handler is not None:
            response = await self._run(match.handler, Request(scope, receive), match.params, path.startswith("/api/"))
        elif match.redirect is not None and method == "GET" and path.endswith("/"):
            query = scope.get("query_string", b"").decode("latin-1")
            location = self.base + match.redirect + ("?" + query if query else "")
            response = Response(b"", 301, {"Location": location})  # httprouter's trailing slash
        elif match.allowed:
            response = error_response(405, "METHOD_NOT_ALLOWED")
        else:
            response = error_response(404, "NOT_FOUND")
        await response(scope, receive, send)

    async def _run(self, handler: Handler, request: Request, params: dict[str, str], api: bool) -> Response:
        try:
            if api and request.method in ("POST", "DELETE") and not self.is_admin(request):
                raise HTTPError(403, "FORBIDDEN")
            data = await handler(request, params)
        except HTTPError as exc:
            return error_response(exc.status, exc.message)
        except AllFailed as exc:
            self.log.error("upstream request failed - %s", exc)
            return error_response(502, f"UPSTREAM_ERROR: {exc}")
        except Exception:
            self.log.exception("ERROR: panic in HTTP handler")
            return error_response(500, "INTERNAL_ERROR")
        return data if isinstance(data, Response) else json_response(data)

    def is_admin(self, request: Request) -> bool:
        users = self.options.admin_users
        return not users or request.headers.get(self.options.acl_http_header, "") in users

    # --- pages and assets -----------------------------------------------------------------

    async def ping(self, request: Request, params: dict[str, str]) -> Response:
        return Response("OK", 200, media_type="text/plain; charset=utf-8")

    async def index(self, request: Request, params: dict[str, str]) -> Response:
        html = render_index(self.options, self.is_admin(request), self.assets)
        return Response(html, 200, media_type="text/html; charset=utf-8")

    async def static(self, request: Request, params: dict[str, str]) -> Response:
        name = params["asset"]
        if "/" in name or name.startswith("."):
            raise HTTPError(404, "NOT_FOUND")
        try:
            if self.static_dir is not None:
                body = (self.static_dir / name).read_bytes()
            else:
                body = resources.files("pynsqd.admin").joinpath("static", name).read_bytes()
        except OSError:
            raise HTTPError(404, "NOT_FOUND") from None
        media = _STATIC_TYPES.get(Path(name).suffix, "application/octet-stream")
        immutable = self.static_dir is None and request.query_params.get("v") == self.assets
        cache = "public, max-age=31536000, immutable" if immutable else "no-cache"
        return Response(body, 200, {"Cache-Control": cache}, media)

    # --- reads ----------------------------------------------------------------------------

    async def topics(self, request: Request, params: dict[str, str]) -> Any:
        topics, messages = await self.cluster.topics()
        if request.query_params.get("inactive") == "true":
            inactive: dict[str, list[str]] = {}
            if self.cluster.lookupds:
                found = await asyncio.gather(*(self._inactive_channels(t) for t in topics))
                inactive = {t: channels for t, channels in zip(topics, found) if channels is not None}
            return {"topics": inactive, "message": warn(messages)}
        return {"topics": topics, "message": warn(messages)}

    async def _inactive_channels(self, topic: str) -> list[str] | None:
        """The channels of ``topic`` if no producer holds it (nsqadmin's "inactive"), else None."""
        try:
            producers, _ = await self.cluster.topic_producers(topic)
            if producers:
                return None
            channels, _ = await self.cluster.topic_channels(topic)
        except AllFailed:
            return None
        return channels

    async def topic(self, request: Request, params: dict[str, str]) -> Any:
        """nsqadmin's topicHandler: a topic no lookupd knows, or no nsqd holds, is 502
        ``UPSTREAM_ERROR`` (``Cluster.topic_producers`` strict, ``producer_stats`` of none)."""
        topic = params["topic"]
        producers, messages = await self.cluster.topic_producers(topic, strict=True)
        stats, more = await self.cluster.producer_stats(producers, topic, include_clients=False)
        messages += more
        nodes = [node_topic(t, p.http_address, p.hostname) for p, data in stats
                 for t in data.get("topics") or [] if t["topic_name"] == topic]
        return {**total_topic(topic, nodes), "message": warn(messages)}

    async def channel(self, request: Request, params: dict[str, str]) -> Any:
        topic, channel = params["topic"], params["channel"]
        producers, messages = await self.cluster.topic_producers(topic, strict=True)
        stats, more = await self.cluster.producer_stats(producers, topic, channel, include_clients=True)
        messages += more
        nodes: list[dict[str, Any]] = []
        for p, data in stats:
            for t in data.get("topics") or []:
                if t["topic_name"] == topic:
                    nodes += [c for c in node_topic(t, p.http_address, p.hostname)["channels"]
                              if c["channel_name"] == channel]
        return {**total_channel(topic, channel, nodes), "message": warn(messages)}

    async def nodes(self, request: Request, params: dict[str, str]) -> Any:
        producers, messages = await self.cluster.producers()
        return {"nodes": [p.public() for p in producers], "message": warn(messages)}

    async def node_detail(self, request: Request, params: dict[str, str]) -> Any:
        node = params["node"]
        producers, messages = await self.cluster.producers()
        producer = next((p for p in producers if node in (p.http_address, p.tcp_address)), None)
        if producer is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        stats, _ = await self.cluster.producer_stats([producer], include_clients=True)
        topics = [node_topic(t, producer.http_address, producer.hostname)
                  for _, data in stats for t in data.get("topics") or []]
        return {"node": node, "topics": topics,
                "total_messages": sum(t["message_count"] for t in topics),
                "total_clients": sum(len(c["clients"] or []) for t in topics for c in t["channels"]),
                "message": warn(messages)}

    async def counter(self, request: Request, params: dict[str, str]) -> Any:
        producers, messages = await self.cluster.producers()
        stats: dict[str, Any] = {}
        if producers:
            answers, more = await self.cluster.producer_stats(producers, include_clients=False)
            messages += more
            for p, data in answers:
                for t in data.get("topics") or []:
                    for c in t.get("channels") or []:
                        key = f"{t['topic_name']}:{c['channel_name']}:{p.http_address}"
                        row = stats.setdefault(key, {"node": p.http_address, "topic_name": t["topic_name"],
                                                     "channel_name": c["channel_name"], "message_count": 0})
                        row["message_count"] += int(c.get("message_count", 0))
        return {"stats": stats, "message": warn(messages)}

    async def rates(self, request: Request, params: dict[str, str]) -> Any:
        sampler = self.sampler
        topic = request.query_params.get("topic")
        out: dict[str, Any] = {"interval_ms": self.options.stats_sample_interval // 1_000_000,
                               "sampled_at": sampler.sampled_at, "samples": sampler.samples,
                               "message": warn([sampler.warning] if sampler.warning else [])}
        if topic is None:
            out["topics"] = sampler.topics
            return out
        out["topic"] = sampler.series((topic, ""))
        out["channels"] = {c: sampler.series((t, c)) for t, c in list(sampler.readings) if t == topic and c}
        return out

    async def graphite(self, request: Request, params: dict[str, str]) -> Any:
        metric = request.query_params.get("metric")
        if metric != "rate":
            raise HTTPError(400, "INVALID_ARG_METRIC")
        target = request.query_params.get("target")
        if target is None:
            raise HTTPError(400, "INVALID_ARG_TARGET")
        if not self.options.graphite_url:
            raise HTTPError(500, "INTERNAL_ERROR")
        interval = self.options.statsd_interval // SECOND
        query = {"from": f"-{interval * 2}sec", "until": f"-{interval}sec", "format": "json", "target": target}
        try:
            data = await self.cluster.request("GET", self.options.graphite_url, "/render", query)
            rate = data[0]["datapoints"][0][0]
        except Exception as exc:
            self.log.error("graphite request failed - %s", exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        return {"rate": "N/A" if rate is None or rate < 0 else f"{rate / interval:.2f}"}

    async def render_proxy(self, request: Request, params: dict[str, str]) -> Response:
        url = self.options.graphite_url + "/render"
        upstream = await self.cluster.client.get(url, params=str(request.query_params))
        return Response(upstream.content, upstream.status_code,
                        media_type=upstream.headers.get("content-type", "application/octet-stream"))

    # --- actions --------------------------------------------------------------------------

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise HTTPError(400, "INVALID_BODY") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "INVALID_BODY")
        return body

    async def create(self, request: Request, params: dict[str, str]) -> Any:
        body = await self._body(request)
        topic, channel = str(body.get("topic") or ""), str(body.get("channel") or "")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if channel and not is_valid_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        messages = await actions.create(self.cluster, topic, channel)
        self.notify("create_topic", topic, "", "", request)
        if channel:
            self.notify("create_channel", topic, channel, "", request)
        return {"message": warn(messages)}

    async def action(self, request: Request, params: dict[str, str]) -> Any:
        topic, channel = params["topic"], params.get("channel", "")
        body = await self._body(request)
        action = body.get("action")
        if action not in ("pause", "unpause", "empty"):
            raise HTTPError(400, "INVALID_ACTION")
        messages = await actions.topic_channel_action(self.cluster, action, topic, channel)
        self.notify(f"{action}_{'channel' if channel else 'topic'}", topic, channel, "", request)
        return {"message": warn(messages)}

    async def delete(self, request: Request, params: dict[str, str]) -> Any:
        topic, channel = params["topic"], params.get("channel", "")
        messages = await actions.delete(self.cluster, topic, channel)
        self.notify("delete_channel" if channel else "delete_topic", topic, channel, "", request)
        return {"message": warn(messages)}

    async def tombstone(self, request: Request, params: dict[str, str]) -> Any:
        node = params["node"]
        body = await self._body(request)
        topic = str(body.get("topic") or "")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        messages = await actions.tombstone(self.cluster, topic, node)
        self.notify("tombstone_topic_producer", topic, "", node, request)
        return {"message": warn(messages)}

    # --- /config --------------------------------------------------------------------------

    async def config(self, request: Request, params: dict[str, str]) -> Any:
        cidr = self.options.allow_config_from_cidr
        if cidr:
            client = request.client.host if request.client else ""
            try:
                ip = ipaddress.ip_address(client)
            except ValueError:
                raise HTTPError(400, "INVALID_REMOTE_ADDR") from None
            if ip not in ipaddress.ip_network(cidr, strict=False):
                raise HTTPError(403, "FORBIDDEN")
        opt = params["opt"]
        if request.method == "PUT":
            body = await request.body()
            if not body or len(body) > 1024 * 1024:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    value = orjson.loads(body)
                except orjson.JSONDecodeError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise HTTPError(400, "INVALID_VALUE")
                self.options.lookupd_http_addresses = value
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").strip().lower()
                if level not in logs.LEVELS:
                    raise HTTPError(400, "INVALID_VALUE")
                self.options.log_level = level
                logs.set_level(level)
            else:
                raise HTTPError(400, "INVALID_OPTION")
        try:
            return config_value(self.options, opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None


def _assets_hash() -> str:
    digest = hashlib.sha1()
    for entry in sorted(resources.files("pynsqd.admin").joinpath("static").iterdir(), key=lambda e: e.name):
        digest.update(entry.name.encode() + entry.read_bytes())
    return digest.hexdigest()[:12]

