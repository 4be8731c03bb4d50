"""nsqlookupd's HTTP API: discovery queries for consumers and admin changes, as NSQ v1.3.

Theory of operation
-------------------
``LookupHTTP`` is a plain ASGI app (Starlette's response classes, served on a socket the
node bound by ``httpserver.py``). Routing is a table of ``(method, path, handler)``
(``httpkit.RouteTable``) and follows julienschmidt/httprouter as NSQ configures it: an unknown path is
404 ``NOT_FOUND``; a known path with another method is 405 ``METHOD_NOT_ALLOWED`` with an
``Allow`` header; ``OPTIONS`` answers with ``Allow``; ``/ping/`` or ``/PING`` redirect to
``/ping`` (301 for GET, 307 otherwise).

Handlers return data or raise ``httpkit.HTTPError``; one place (``_respond``) renders both as NSQ's
``internal/http_api`` does: "V1" routes send JSON with ``Content-Type: application/json;
charset=utf-8`` (``None`` as an empty body), errors as ``{"message":"<CODE>"}``, and every
V1 response carries ``X-NSQ-Content-Type: nsq; version=1.0``; ``/ping`` is plain text.
JSON is Go-compatible: ``<``, ``>``, ``&``, U+2028 and U+2029 are escaped, and map-shaped
objects (``/debug``) have sorted keys. Query strings parse as Go's ``url.ParseQuery``;
one it rejects (a bad ``%`` escape, a ``;``) is 400 ``INVALID_REQUEST``.

Not served: ``/debug/pprof`` (Go's profiler; 404 here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pynsqd import NSQ_VERSION
from pynsqd.httpkit import HTTPError, Params, RouteTable, Sorted, error_response, json_response, parse_query
from pynsqd.lookupd.registry import (
    RegistrationDB,
    channel_key,
    filter_by_active,
    keys,
    subkeys,
    topic_key,
)
from pynsqd.wire.names import is_valid_name

Handler = Callable[[Params], Any]
_PLAIN = "text/plain; charset=utf-8"


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
        self.plain = {self.ping}  # text bodies without X-NSQ-Content-Type
        self.routes: RouteTable[Handler] = RouteTable([
            ("GET", "/ping", self.ping),
            ("GET", "/info", self.info),
            ("GET", "/debug", self.debug),
            ("GET", "/lookup", self.lookup),
            ("GET", "/topics", self.topics),
            ("GET", "/channels", self.channels),
            ("GET", "/nodes", self.nodes),
            ("POST", "/topic/create", self.create_topic),
            ("POST", "/topic/delete", self.delete_topic),
            ("POST", "/topic/tombstone", self.tombstone_topic_producer),
            ("POST", "/channel/create", self.create_channel),
            ("POST", "/channel/delete", self.delete_channel),
        ])

    # --- ASGI -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method, path, query = scope["method"], scope["path"], scope.get("query_string", b"")
        match = self.routes.match(method, path)
        if match.handler is not None:
            response = self._run(match.handler, query)
        else:
            response = self._no_route(method, match.allowed, match.redirect, query)
        await response(scope, receive, send)

    def _run(self, handler: Handler, query: bytes) -> Response:
        plain = handler in self.plain
        try:
            data = handler(parse_query(query))
        except HTTPError as exc:
            return self._respond(exc.status, exc.message, plain)
        except Exception:
            self.log.exception("ERROR: panic in HTTP handler")
            return self._respond(500, "INTERNAL_ERROR", plain)
        return self._respond(200, data, plain)

    @staticmethod
    def _respond(status: int, data: Any, plain: bool) -> Response:
        if plain:
            return Response(str(data), status, media_type=_PLAIN)
        return json_response(data) if status == 200 else error_response(status, data)

    def _no_route(self, method: str, allowed: tuple[str, ...], redirect: str | None, query: bytes) -> Response:
        if method == "OPTIONS" and allowed:
            return Response(b"", 200, {"Allow": ", ".join((*allowed, "OPTIONS"))})
        if redirect is not None:
            location = redirect + ("?" + query.decode("latin-1") if query else "")
            status = 301 if method == "GET" else 307
            if method != "GET":  # Go's http.Redirect writes no body then
                return Response(b"", status, {"Location": location})
            body = f'<a href="{location}">Moved Permanently</a>.\n\n'
            return Response(body, status, {"Location": location}, "text/html; charset=utf-8")
        if allowed:
            response = error_response(405, "METHOD_NOT_ALLOWED")
            response.headers["Allow"] = ", ".join((*allowed, "OPTIONS"))
            return response
        return error_response(404, "NOT_FOUND")

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
