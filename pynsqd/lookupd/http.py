"""nsqlookupd's HTTP API: discovery queries for consumers and admin changes, as NSQ v1.3.

Theory of operation
-------------------
``LookupHTTP`` is a plain ASGI app (Starlette's request and response classes, served by
uvicorn on a socket the node bound). Routing is a table, ``path → (method, handler,
style)``, and follows julienschmidt/httprouter as NSQ configures it: an unknown path is
404 ``NOT_FOUND``; a known path with another method is 405 ``METHOD_NOT_ALLOWED`` with an
``Allow`` header; ``OPTIONS`` answers with ``Allow``; ``/ping/`` or ``/PING`` redirect to
``/ping`` (301 for GET, 307 otherwise).

Handlers return data or raise ``HTTPError``; one place (``_respond``) renders both as NSQ's
``internal/http_api`` does: "V1" routes send JSON with ``Content-Type: application/json;
charset=utf-8`` (``None`` as an empty body), errors as ``{"message":"<CODE>"}``, and every
V1 response carries ``X-NSQ-Content-Type: nsq; version=1.0``; ``/ping`` is plain text.
JSON is Go-compatible: ``<``, ``>``, ``&``, U+2028 and U+2029 are escaped, and map-shaped
objects (``/debug``) have sorted keys. Query strings parse as Go's ``url.ParseQuery``;
one it rejects (a bad ``%`` escape, a ``;``) is 400 ``INVALID_REQUEST``.

Not served: ``/debug/pprof`` (Go's profiler; 404 here).
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pynsqd import NSQ_VERSION
from pynsqd.lookupd.registry import (
    RegistrationDB,
    channel_key,
    filter_by_active,
    keys,
    subkeys,
    topic_key,
)
from pynsqd.wire.names import is_valid_name

NSQ_CONTENT_TYPE = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_TYPE = "application/json; charset=utf-8"
_GO_ESCAPES = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"),
               ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Sorted(dict[str, Any]):
    """A JSON object rendered with sorted keys, as Go renders a map."""


def go_json(data: Any) -> bytes:
    """JSON as Go's ``encoding/json`` writes it (HTML-safe escaping)."""
    option = orjson.OPT_SORT_KEYS if isinstance(data, Sorted) else 0
    out = orjson.dumps(data, option=option)
    for raw, escaped in _GO_ESCAPES:
        if raw in out:
            out = out.replace(raw, escaped)
    return out


def parse_query(raw: bytes) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``; raises ``HTTPError`` 400 ``INVALID_REQUEST`` where Go errs."""
    values: dict[str, list[str]] = {}
    bad = False
    for part in raw.split(b"&"):
        if b";" in part:
            bad = True
            continue
        if not part:
            continue
        key, _, value = part.partition(b"=")
        try:
            k, v = _unescape(key), _unescape(value)
        except ValueError:
            bad = True
            continue
        values.setdefault(k, []).append(v)
    if bad:
        raise HTTPError(400, "INVALID_REQUEST")
    return values


def _unescape(raw: bytes) -> str:
    pos = raw.find(b"%")
    while pos >= 0:
        pair = raw[pos + 1:pos + 3]
        if len(pair) != 2 or not all(c in b"0123456789abcdefABCDEF" for c in pair):
            raise ValueError("invalid URL escape")
        pos = raw.find(b"%", pos + 3)
    return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8", "replace")


Params = dict[str, list[str]]
Handler = Callable[[Params], Any]


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    handler: Handler
    plain: bool = False  # text body, no X-NSQ-Content-Type (/ping)


def _arg(params: Params, name: str, missing: str) -> str:
    values = params.get(name)
    if values is None:
        raise HTTPError(400, missing)
    return values[0]


def _topic_channel(params: Params) -> tuple[str, str]:
    """``GetTopicChannelArgs``: both present and valid, checked in this order."""
    topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = _arg(params, "channel", "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


class LookupHTTP:
    """The ASGI app. ``inactive_producer_timeout`` and ``tombstone_lifetime`` are ns."""

    def __init__(self, db: RegistrationDB, inactive_producer_timeout: int,
                 tombstone_lifetime: int, log: logging.Logger,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.db = db
        self.inactive_producer_timeout = inactive_producer_timeout
        self.tombstone_lifetime = tombstone_lifetime
        self.log = log
        self.clock = clock
        self.routes: dict[str, Route] = {
            "/ping": Route("GET", self.ping, plain=True),
            "/info": Route("GET", self.info),
            "/debug": Route("GET", self.debug),
            "/lookup": Route("GET", self.lookup),
            "/topics": Route("GET", self.topics),
            "/channels": Route("GET", self.channels),
            "/nodes": Route("GET", self.nodes),
            "/topic/create": Route("POST", self.create_topic),
            "/topic/delete": Route("POST", self.delete_topic),
            "/topic/tombstone": Route("POST", self.tombstone_topic_producer),
            "/channel/create": Route("POST", self.create_channel),
            "/channel/delete": Route("POST", self.delete_channel),
        }

    # --- ASGI -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        route = self.routes.get(path)
        if route is not None and route.method == method:
            response = self._run(route, scope.get("query_string", b""))
        else:
            response = self._no_route(method, path, route, scope.get("query_string", b""))
        await response(scope, receive, send)

    def _run(self, route: Route, query: bytes) -> Response:
        try:
            data = route.handler(parse_query(query))
        except HTTPError as exc:
            return self._respond(exc.status, exc.message, route.plain)
        except Exception:
            self.log.exception("ERROR: panic in HTTP handler")
            return self._respond(500, "INTERNAL_ERROR", route.plain)
        return self._respond(200, data, route.plain)

    def _respond(self, status: int, data: Any, plain: bool) -> Response:
        if plain:
            return Response(str(data), status, media_type="text/plain; charset=utf-8")
        headers = dict([NSQ_CONTENT_TYPE])
        if status != 200:
            return Response(go_json({"message": data}), status, headers, JSON_TYPE)
        if data is None:
            return Response(b"", 200, headers)
        if isinstance(data, (str, bytes)):
            return Response(data, 200, headers)
        return Response(go_json(data), 200, headers, JSON_TYPE)

    def _no_route(self, method: str, path: str, route: Route | None, query: bytes) -> Response:
        if method == "OPTIONS" and route is not None:
            return Response(b"", 200, {"Allow": f"{route.method}, OPTIONS"})
        if method != "CONNECT" and path != "/":
            fixed = self._fixed_path(method, path)
            if fixed is not None:
                location = fixed + ("?" + query.decode("latin-1") if query else "")
                status = 301 if method == "GET" else 307
                if method != "GET":  # Go's http.Redirect writes no body then
                    return Response(b"", status, {"Location": location})
                body = f'<a href="{location}">Moved Permanently</a>.\n\n'
                return Response(body, status, {"Location": location}, "text/html; charset=utf-8")
        if route is not None:
            response = self._respond(405, "METHOD_NOT_ALLOWED", False)
            response.headers["Allow"] = f"{route.method}, OPTIONS"
            return response
        return self._respond(404, "NOT_FOUND", False)

    def _fixed_path(self, method: str, path: str) -> str | None:
        """httprouter's RedirectTrailingSlash and RedirectFixedPath, for our flat routes."""
        mine = [p for p, r in self.routes.items() if r.method == method]
        if path.endswith("/") and path[:-1] in mine:
            return path[:-1]
        clean = posixpath.normpath("/" + path).lstrip("/")
        clean = "/" + clean.rstrip("/") if clean else "/"
        for candidate in mine:
            if candidate.lower() == clean.lower() and candidate != path:
                return candidate
        return None

    # --- handlers -------------------------------------------------------------------------

    def ping(self, params: Params) -> str:
        return "OK"

    def info(self, params: Params) -> Any:
        return {"version": NSQ_VERSION}

    def debug(self, params: Params) -> Any:
        data = Sorted()
        for key, producers in self.db.items():
            if not producers:
                continue
            data[f"{key.category}:{key.key}:{key.subkey}"] = [{
                "id": p.peer.id, "hostname": p.peer.hostname,
                "broadcast_address": p.peer.broadcast_address, "tcp_port": p.peer.tcp_port,
                "http_port": p.peer.http_port, "version": p.peer.version,
                "last_update": p.peer.last_update, "tombstoned": p.tombstoned,
                "tombstoned_at": p.tombstoned_at,
            } for p in producers]
        return data

    def lookup(self, params: Params) -> Any:
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        if not self.db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = subkeys(self.db.find_registrations("channel", topic, "*"))
        producers = filter_by_active(self.db.find_producers("topic", topic, ""), self.clock(),
                                     self.inactive_producer_timeout, self.tombstone_lifetime)
        return {"channels": channels, "producers": [p.peer.public() for p in producers]}

    def topics(self, params: Params) -> Any:
        return {"topics": keys(self.db.find_registrations("topic", "*", ""))}

    def channels(self, params: Params) -> Any:
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        return {"channels": subkeys(self.db.find_registrations("channel", topic, "*"))}

    def nodes(self, params: Params) -> Any:
        now = self.clock()
        clients = filter_by_active(self.db.find_producers("client", "", ""), now,
                                   self.inactive_producer_timeout, 0)  # tombstoned stay
        nodes = []
        for client in clients:
            peer = client.peer
            topics = [r.key for r in self.db.lookup_registrations(peer.id) if r.category == "topic"]
            tombstones = []
            for topic in topics:
                entry = self.db.producer(topic_key(topic), peer.id)
                tombstones.append(entry is not None
                                  and entry.is_tombstoned(self.tombstone_lifetime, now))
            nodes.append({**peer.public(), "tombstones": tombstones, "topics": topics})
        return {"producers": nodes}

    def create_topic(self, params: Params) -> None:
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(topic_key(topic))

    def delete_topic(self, params: Params) -> None:
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        for key in self.db.find_registrations("channel", topic, "*"):
            self.log.info("DB: removing channel(%s) from topic(%s)", key.subkey, topic)
            self.db.remove_registration(key)
        for key in self.db.find_registrations("topic", topic, ""):
            self.log.info("DB: removing topic(%s)", topic)
            self.db.remove_registration(key)

    def tombstone_topic_producer(self, params: Params) -> None:
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        node = _arg(params, "node", "MISSING_ARG_NODE")
        self.log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        now = self.clock()
        for producer in self.db.find_producers("topic", topic, ""):
            if f"{producer.peer.broadcast_address}:{producer.peer.http_port}" == node:
                producer.tombstone(now)

    def create_channel(self, params: Params) -> None:
        topic, channel = _topic_channel(params)
        self.log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(channel_key(topic, channel))
        self.log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(topic_key(topic))

    def delete_channel(self, params: Params) -> None:
        topic, channel = _topic_channel(params)
        found = self.db.find_registrations("channel", topic, channel)
        if not found:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for key in found:
            self.db.remove_registration(key)
